"""An MXNet Gluon user's own code as they write it, on the public API (tests/test_mxnet_usercode.py runs it
at 1 and 2 ranks through `toolkit launch`):

    loop      a small convolutional net in the idiom of Gluon's tutorials: no in_channels/in_units
              (Gluon's deferred initialisation; `--explicit` gives them), optionally hybridized, with
              MXNet's own FactorScheduler on the optimizer passed to setup(), stepped by the session
              or (`--trainer-step`) by the Trainer setup() returned; checkpoints, resume
    fields    a Gluon dataset of three fields (image, label, index), and one whose batchify_fn
              makes dicts, evaluated with `evaluate(metric=...)`
    gan       a tiny GAN: generator and discriminator, each set up with its own optimizer, `step(optimizer)`;
              checkpoints hold both (stop at a step, resume, compare with the run that did not stop)

and, for the built-in script, `build(config)` (the deferred net; `build_explicit` the same with every
input size given) and `load(config)`:

    python examples/train.py --framework mxnet --model tests/user_gluon.py:build --dataset tests/user_gluon.py:load

Every rank writes `<out>.<rank>.json`: what the test compares across ranks and runs. The samples carry
their index (the image's first pixel is index / N), so the test can count what every rank saw.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import toolkit  # noqa: E402
from tests import user_code  # noqa: E402
from toolkit.adapters.topology import digest  # noqa: E402

TRAIN = 384         # of user_code's 512 samples; the rest is held out


def images():
    """user_code's learnable problem as 1x4x4 images (its 16 features); the train part's first pixel
    is the sample's index / TRAIN."""
    x, y = user_code.arrays()
    x = x.reshape(-1, 1, 4, 4)
    x[:TRAIN, 0, 0, 0] = np.arange(TRAIN, dtype=np.float32) / TRAIN
    return (x[:TRAIN], y[:TRAIN].astype(np.float32)), (x[TRAIN:], y[TRAIN:].astype(np.float32))


def net(explicit: bool = False, block: bool = False):
    """Conv2D -> BatchNorm -> ReLU -> Dense, as Gluon's tutorials write it (shapes from the data), or
    with every input size given; a HybridSequential, or with `block` a plain (imperative) Sequential."""
    from mxnet import gluon
    model = gluon.nn.Sequential() if block else gluon.nn.HybridSequential()
    if explicit:
        model.add(gluon.nn.Conv2D(8, 3, padding=1, in_channels=1), gluon.nn.BatchNorm(in_channels=8),
                  gluon.nn.Activation("relu"), gluon.nn.Dense(user_code.CLASSES, in_units=8 * 16))
    else:
        model.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
                  gluon.nn.Dense(user_code.CLASSES))
    return model


def build(config):
    return net()


def build_explicit(config):
    return net(explicit=True)


def load(config):
    from mxnet import gluon
    return tuple(gluon.data.ArrayDataset(*part) for part in images())


def digest_now(session) -> str:
    return digest(session.replica_parameters()[0])


def loop(a, session) -> dict:
    import mxnet as mx
    from mxnet import autograd, gluon
    model = net(a.explicit, a.block)
    if a.hybridize:
        model.hybridize()
    schedule = mx.lr_scheduler.FactorScheduler(step=5, factor=0.7, base_lr=0.1)
    optimizer = mx.optimizer.SGD(momentum=0.9, lr_scheduler=schedule)
    model, trainer = session.setup(model, optimizer)
    own_init = list(session.local_digests)          # explicit shapes: this rank's model before the broadcast
    (x, y), held_out = images()
    loader = session.loader(gluon.data.ArrayDataset(x, y))
    meta = session.load() if a.resume else {}
    if session.rank == 1:
        mx.nd.random.uniform(shape=(7,))            # this rank's random stream is not rank 0's any more
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    seen, lrs, after_first = {}, [], None
    for epoch in range(meta.get("epoch", 0), a.epochs):
        loader.set_epoch(epoch)
        for images_batch, labels in loader:
            with autograd.record():
                loss = loss_fn(model(images_batch), labels)
            if after_first is None:
                own_init = own_init or list(session.local_digests)      # deferred: made by that first pass
                after_first = digest_now(session)
            seen.setdefault(epoch, []).extend(int(round(float(v) * TRAIN)) for v in images_batch[:, 0, 0, 0].asnumpy())
            if a.trainer_step:                        # Gluon's own verbs on the Trainer setup() returned
                loss.backward()
                trainer.step(len(labels))
                continue
            session.backward(loss)
            if session.step() and session.global_step == a.save_at:
                session.save(a.checkpoint_dir, epoch=epoch)
                if a.save_at == a.stop_at:
                    return {"stopped": True}
        lrs.append([trainer.learning_rate, optimizer.learning_rate, schedule.base_lr])
    loss_value, accuracy = session.evaluate(session.loader(gluon.data.ArrayDataset(*held_out), train=False))
    return {"own_init": own_init, "after_first": after_first, "seen": seen, "lrs": lrs, "accuracy": accuracy,
            "loss": loss_value, "digests": session.check_replicas(),
            "weights": [w.ravel().tolist() for w in session.weights()]}


def gan(a, session) -> dict:
    """Points on a ring (the data) against a generator from 4-d noise, as tests/user_torch.py's GAN. The
    noise of a step is drawn from the step number, so a resumed run draws what the uninterrupted one drew."""
    import mxnet as mx
    from mxnet import autograd, gluon
    samples, noise_size = 256, 4
    generator = gluon.nn.HybridSequential()
    generator.add(gluon.nn.Dense(16, activation="relu", in_units=noise_size), gluon.nn.Dense(2, in_units=16))
    discriminator = gluon.nn.HybridSequential()
    discriminator.add(gluon.nn.Dense(16, in_units=2), gluon.nn.LeakyReLU(0.2), gluon.nn.Dense(1, in_units=16))
    generator, g_opt = session.setup(generator, mx.optimizer.Adam(learning_rate=0.003))
    discriminator, d_opt = session.setup(discriminator, mx.optimizer.SGD(learning_rate=0.05, momentum=0.9))
    angle = np.random.RandomState(3).uniform(0, 2 * np.pi, samples)
    ring = np.stack([np.cos(angle), np.sin(angle)], 1).astype(np.float32)
    loader = session.loader((ring, np.arange(samples)))          # (points, index): any arity
    meta = session.load() if a.resume else {}
    bce = gluon.loss.SigmoidBinaryCrossEntropyLoss()
    seen, losses = [], []
    for epoch in range(meta.get("epoch", 0), a.epochs):
        loader.set_epoch(epoch)
        for real, index in loader:
            n = len(real)
            z = mx.nd.array(np.random.RandomState(1000 * session.global_step).randn(n, noise_size).astype(np.float32))
            ones, zeros = mx.nd.ones((n, 1)), mx.nd.zeros((n, 1))
            with autograd.record():
                fake = generator(z)
                d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
            session.backward(d_loss)
            session.step(d_opt)
            with autograd.record():
                g_loss = bce(discriminator(generator(z)), ones)         # also gives D gradients
            session.backward(g_loss)
            session.step(g_opt)
            seen += index.asnumpy().astype(int).tolist()
            losses.append([float(d_loss.mean().asscalar()), float(g_loss.mean().asscalar())])
            if a.stop_at and session.global_step == a.stop_at:
                session.save(a.checkpoint_dir, epoch=epoch)
                return {"stopped": True}
        if a.checkpoint_dir:
            session.save(a.checkpoint_dir, epoch=epoch + 1)
    return {"seen": seen, "losses": losses, "digests": session.check_replicas(),
            "weights": [float(p.data().sum().asscalar()) for m in (generator, discriminator)
                        for p in m.collect_params().values()]}


class Records:
    """What a Hugging Face-style dataset gives: a dict per sample (Gluon's own batchify takes only
    fields; the session's batches dicts key by key)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"image": self.x[i], "label": self.y[i]}


def fields(a, session) -> dict:
    """Three-field samples (image, label, index) in a loop; the held-out set evaluated as (x, y), as
    dict samples and through a batchify_fn that makes dicts, with `evaluate(metric=...)`."""
    from mxnet import autograd, gluon
    model, _ = session.setup(net(explicit=True))
    (x, y), held_out = images()
    loader = session.loader(gluon.data.ArrayDataset(x, y, np.arange(TRAIN, dtype=np.float32)))
    seen, arity = {}, set()
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            arity.add(len(batch))
            images_batch, labels, index = batch
            with autograd.record():
                loss = gluon.loss.SoftmaxCrossEntropyLoss()(model(images_batch), labels)
            session.backward(loss)
            session.step()
            seen.setdefault(epoch, []).extend(int(v) for v in index.asnumpy())

    def metric(model, batch):
        out = model(batch["image"])
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(out, batch["label"]).mean()
        return loss, (out.argmax(axis=1) == batch["label"]).sum()

    def as_dict(samples):
        import mxnet as mx
        return {"image": mx.nd.array(np.stack([s[0] for s in samples])),
                "label": mx.nd.array(np.array([s[1] for s in samples]))}

    pairs = gluon.data.ArrayDataset(*held_out)
    by_pair = session.evaluate(session.loader(pairs, train=False))
    by_records = session.evaluate(session.loader(gluon.data.SimpleDataset(Records(*held_out)), train=False),
                                  metric=metric)
    by_batchify = session.evaluate(session.loader(pairs, train=False, batchify_fn=as_dict), metric=metric)
    return {"seen": seen, "arity": sorted(arity), "by_pair": by_pair, "by_records": by_records,
            "by_batchify": by_batchify, "digests": session.check_replicas()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["loop", "fields", "gan"])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accumulation-steps", type=int, default=1)
    p.add_argument("--explicit", action="store_true", help="layers with in_channels/in_units")
    p.add_argument("--hybridize", action="store_true")
    p.add_argument("--block", action="store_true", help="a plain Sequential (a Block, not a HybridBlock)")
    p.add_argument("--trainer-step", action="store_true", help="loss.backward(); trainer.step(n), not the session's")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--save-at", type=int, default=0, help="save a checkpoint after this many optimizer steps")
    p.add_argument("--stop-at", type=int, default=0, help="and exit there (an interrupted run)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--compression", default="none", help="topk: the toolkit's exchange, with error feedback")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    session = toolkit.start(framework="mxnet", batch_size=a.batch_size, accumulation_steps=a.accumulation_steps,
                            optimizer="sgd", lr=0.1, checkpoint_dir=a.checkpoint_dir, resume=a.resume,
                            compression=a.compression, error_feedback=a.compression != "none" or None)
    record = {"loop": loop, "fields": fields, "gan": gan}[a.case](a, session)
    record.update(rank=session.rank, size=session.size, global_step=session.global_step)
    Path(f"{a.out}.{session.rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
