"""A PyTorch user's own code as they write it, on the public API (tests/test_usercode.py runs it at 1 and
2 ranks through `toolkit launch`):

    gan       a tiny GAN: generator and discriminator, each set up with its own optimizer, `step(optimizer)`;
              checkpoints hold both (stop at a step, resume, compare with the run that did not stop)
    hf        a Hugging Face-style dataset of dicts (`input_ids`, `attention_mask`, `labels` of varying
              length) through a padding `collate_fn` into a `transformers` GPT-2 with its own loss;
              `evaluate(metric=...)`
    schedule  torch's own OneCycleLR stepped on the optimizer setup() returns

Every rank writes `<out>.<rank>.json`: what the test compares across ranks and runs.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import toolkit  # noqa: E402

SAMPLES, NOISE = 256, 4


def gan(a, session) -> dict:
    """Points on a ring (the data) against a generator from 4-d noise. The noise of a step is drawn
    from the step number, so a resumed run draws what the uninterrupted one drew."""
    bce = torch.nn.BCEWithLogitsLoss()
    # the generator with the config's optimizer (Adam), the discriminator with its own (SGD)
    generator, g_opt = session.setup(torch.nn.Sequential(torch.nn.Linear(NOISE, 16), torch.nn.ReLU(),
                                                         torch.nn.Linear(16, 2)))
    discriminator = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
    discriminator, d_opt = session.setup(discriminator, torch.optim.SGD(discriminator.parameters(), lr=0.05,
                                                                        momentum=0.9))
    angle = np.random.RandomState(3).uniform(0, 2 * np.pi, SAMPLES)
    ring = np.stack([np.cos(angle), np.sin(angle)], 1).astype(np.float32)
    loader = session.loader((ring, np.arange(SAMPLES)))         # (points, index): any arity
    meta = session.load() if a.resume else {}
    seen, losses = [], []
    for epoch in range(meta.get("epoch", 0), a.epochs):
        loader.set_epoch(epoch)
        for real, index in loader:
            noise = torch.Generator().manual_seed(1000 * session.global_step)
            z = torch.randn(len(real), NOISE, generator=noise)
            fake = generator(z)
            d_loss = (bce(discriminator(real), torch.ones(len(real), 1))
                      + bce(discriminator(fake.detach()), torch.zeros(len(real), 1)))
            session.backward(d_loss)
            session.step(d_opt)
            g_loss = bce(discriminator(generator(z)), torch.ones(len(real), 1))   # also gives D gradients
            session.backward(g_loss)
            session.step(g_opt)
            seen += index.tolist()
            losses.append([d_loss.item(), g_loss.item()])
            if a.stop_at and session.global_step == a.stop_at:
                session.save(a.checkpoint_dir, epoch=epoch)
                return {"stopped": True}
        if a.checkpoint_dir:
            session.save(a.checkpoint_dir, epoch=epoch + 1)
    return {"seen": seen, "losses": losses, "digests": session.check_replicas(),
            "weights": [float(v.sum()) for m in (generator, discriminator) for v in m.state_dict().values()]}


class Tokens(torch.utils.data.Dataset):
    """What a tokenized Hugging Face dataset gives: a dict of token ids per sample, lengths varying.
    The sequence is a counting pattern (learnable); `idx` lets the test count what each rank saw."""

    def __init__(self, n: int, seed: int):
        rng = np.random.RandomState(seed)
        self.samples = []
        for i in range(n):
            length, start = rng.randint(6, 13), rng.randint(0, 40)
            ids = torch.arange(start, start + length) % 48 + 2
            self.samples.append({"idx": i, "input_ids": ids, "attention_mask": torch.ones(length, dtype=torch.long)})

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def pad(samples):
    """A collate_fn as transformers' padding collators write it: pad to the longest, labels -100 there."""
    width = max(len(s["input_ids"]) for s in samples)
    batch = {"idx": torch.tensor([s["idx"] for s in samples]),
             "input_ids": torch.zeros(len(samples), width, dtype=torch.long),
             "attention_mask": torch.zeros(len(samples), width, dtype=torch.long),
             "labels": torch.full((len(samples), width), -100, dtype=torch.long)}
    for row, s in enumerate(samples):
        n = len(s["input_ids"])
        batch["input_ids"][row, :n] = s["input_ids"]
        batch["attention_mask"][row, :n] = 1
        batch["labels"][row, :n] = s["input_ids"]
    return batch


def hf(a, session) -> dict:
    import transformers
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                     bos_token_id=1, eos_token_id=1, loss_type="ForCausalLM")
    model, optimizer = session.setup(transformers.GPT2LMHeadModel(config))
    train = session.loader(Tokens(SAMPLES, 1), collate_fn=pad)
    held_out = Tokens(60, 2)

    def metric(model, batch):
        """The batch's mean over samples of each sample's mean token loss: a mean that does not
        depend on how the samples are batched (the held-out batches differ by rank and alone)."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"][:, 1:]
        tokens = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels, reduction="none")
        per_sample = (tokens * (labels != -100)).sum(1) / (labels != -100).sum(1)
        return per_sample.mean()

    def evaluation(**options):      # 60 samples in batches of 8: 8, 8, 8, 6 per rank; 8 x 7 + 4 alone
        return session.loader(held_out, batch_size=8, train=False, collate_fn=pad, **options)

    before = session.evaluate(evaluation(), metric=metric)[0]
    seen = []
    for epoch in range(a.epochs):
        train.set_epoch(epoch)
        for batch in train:
            seen += batch.pop("idx").tolist()
            session.backward(model(**batch).loss)
            session.step()
    after, accuracy = session.evaluate(evaluation(), metric=metric)
    # the same model, every held-out sample on this rank alone: the collective mean must equal it
    alone = session.evaluate(evaluation(shard=False), collective=False, metric=metric)[0]
    return {"seen": seen, "before": before, "after": after, "alone": alone, "accuracy": accuracy,
            "digests": session.check_replicas()}


def schedule(a, session) -> dict:
    model, optimizer = session.setup(torch.nn.Linear(8, 2))
    x = np.random.RandomState(0).standard_normal((SAMPLES, 8)).astype(np.float32)
    loader = session.loader((x, (x[:, 0] > 0).astype(np.int64)))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, epochs=a.epochs,
                                                    steps_per_epoch=loader.steps_per_epoch)
    lrs = []
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        for x_batch, y_batch in loader:
            session.backward(torch.nn.functional.cross_entropy(model(x_batch), y_batch))
            if session.step():
                scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return {"lrs": lrs, "steps_per_epoch": loader.steps_per_epoch, "digests": session.check_replicas()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["gan", "hf", "schedule"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--stop-at", type=int, default=0, help="save at this optimizer step and exit")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    session = toolkit.start(framework="torch", batch_size=a.batch_size, optimizer="adam", lr=0.003,
                            checkpoint_dir=a.checkpoint_dir)
    record = {"gan": gan, "hf": hf, "schedule": schedule}[a.case](a, session)
    record.update(rank=session.rank, size=session.size, global_step=session.global_step)
    Path(f"{a.out}.{session.rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
