"""Your PyTorch training script, made data-parallel: the lines marked `# toolkit` are the only
changes to the single-process script it was (README, "Your own model", shows the diff).

    python examples/your_torch.py                                 # one process, as before
    horovodrun -np 2 --gloo python examples/your_torch.py         # two ranks (or toolkit launch, mpirun)
"""
import json
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import toolkit  # toolkit


def main(epochs: int = 10) -> int:
    session = toolkit.start(framework="torch")      # toolkit: hvd.init, one GPU per rank, seeds
    digits = load_digits()
    x, y = torch.tensor(digits.data / 16, dtype=torch.float32), torch.tensor(digits.target)
    train = torch.utils.data.TensorDataset(x[:1400], y[:1400])
    test = torch.utils.data.TensorDataset(x[1400:], y[1400:])
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = session.setup(model, optimizer)                                  # toolkit
    loader = session.loader(train, batch_size=32)     # toolkit: was DataLoader(train, 32, shuffle=True)
    for epoch in range(epochs):
        loader.set_epoch(epoch)                                                         # toolkit
        model.train()
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            session.backward(loss)          # toolkit: was optimizer.zero_grad(); loss.backward()
            session.step()                  # toolkit: was optimizer.step()
    test_loss, accuracy = session.evaluate(session.loader(test, train=False))          # toolkit
    digests = session.check_replicas()      # toolkit: every rank holds the same model
    if session.is_main:                                                                 # toolkit
        print(json.dumps({"framework": "torch", "world_size": session.size, "accuracy": accuracy,
                          "test_loss": test_loss, "final_digests": digests}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
