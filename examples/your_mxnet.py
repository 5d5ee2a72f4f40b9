"""Your MXNet Gluon training script, made data-parallel: the lines marked `# toolkit` are the only
changes to the single-process script it was.

    python examples/your_mxnet.py                                 # one process, as before
    horovodrun -np 2 --gloo python examples/your_mxnet.py         # two ranks (or toolkit launch, mpirun)
"""
import json
import sys

import toolkit  # toolkit


def main(epochs: int = 10) -> int:
    session = toolkit.start(framework="mxnet")       # toolkit: hvd.init, one GPU per rank, seeds
    import mxnet as mx
    from mxnet import autograd, gluon
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16).astype("float32"), digits.target.astype("float32")
    train, test = gluon.data.ArrayDataset(x[:1400], y[:1400]), gluon.data.ArrayDataset(x[1400:], y[1400:])
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(128, in_units=64), gluon.nn.BatchNorm(in_channels=128), gluon.nn.Activation("relu"),
            gluon.nn.Dense(10, in_units=128))
    net.initialize(mx.init.Xavier())
    optimizer = mx.optimizer.SGD(learning_rate=0.05, momentum=0.9)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net, trainer = session.setup(net, optimizer)     # toolkit: was trainer = gluon.Trainer(params, optimizer)
    loader = session.loader(train, batch_size=32)    # toolkit: was gluon.data.DataLoader(train, 32, shuffle=True)
    for epoch in range(epochs):
        loader.set_epoch(epoch)                                                         # toolkit
        for inputs, labels in loader:
            with autograd.record():
                loss = loss_fn(net(inputs), labels)
            session.backward(loss)          # toolkit: was loss.backward()
            session.step()                  # toolkit: was trainer.step(len(labels))
    test_loss, accuracy = session.evaluate(session.loader(test, train=False))          # toolkit
    digests = session.check_replicas()      # toolkit: every rank holds the same model
    if session.is_main:                                                                 # toolkit
        print(json.dumps({"framework": "mxnet", "world_size": session.size, "accuracy": accuracy,
                          "test_loss": test_loss, "final_digests": digests}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
