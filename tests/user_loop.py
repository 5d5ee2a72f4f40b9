"""A user's own training loop on the public API, in each framework (tests/test_api.py runs it under
horovodrun). Its samples carry their index (the first input feature is index / N), so the test can
count what every rank saw; it can stop after some steps with a checkpoint and resume from it.

    horovodrun -np 2 python tests/user_loop.py --framework torch --epochs 2 --out out.json
"""
import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import toolkit  # noqa: E402
from benchmarks.syncs import SyncCounter  # noqa: E402
from tests import user_code  # noqa: E402


def indexed(framework: str):
    """(the training dataset in the framework's own form, N)."""
    x, y = user_code.arrays()
    x[:, 0] = np.arange(len(x), dtype=np.float32) / len(x)        # the index travels with the sample
    if framework == "torch":
        import torch
        data = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    elif framework == "tensorflow":
        import tensorflow as tf
        data = tf.data.Dataset.from_tensor_slices((x, y))
    else:
        from mxnet import gluon
        data = gluon.data.ArrayDataset(x, y.astype(np.float32))
    return data, len(x)


def plain_model(framework: str):
    """The test model without BatchNorm (whose statistics depend on the micro-batch)."""
    if framework == "torch":
        import torch
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if framework == "tensorflow":
        import keras
        return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    from mxnet import gluon
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(32, activation="relu", in_units=16), gluon.nn.Dense(4, in_units=32))
    return net


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accumulation-steps", type=int, default=1)
    p.add_argument("--no-bn", action="store_true", help="the model without BatchNorm")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--save-at", type=int, default=0, help="also save a checkpoint after this many optimizer steps")
    p.add_argument("--stop-at", type=int, default=0, help="exit right after that checkpoint (an interrupted run)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another config key")
    p.add_argument("--train-step", action="store_true", help="step with session.train_step (the built-in "
                   "trainer's verb) instead of backward/step")
    p.add_argument("--record-steps", action="store_true", help="record each step's applied update: "
                   "|w_after - w_before| / lr (with momentum 0: the norm of the gradient the optimizer applied)")
    p.add_argument("--poison-step", type=int, default=-1, help="multiply that step's loss by inf (a blow-up)")
    p.add_argument("--two-optimizers", choices=["one", "named", "all"], help="the model without BatchNorm as a "
                   "backbone and a head: one: one optimizer over both (the reference); named: each set up with "
                   "its own, both stepped after each backward (session.step(head's), then backbone's); all: "
                   "session.step() steps both")
    p.add_argument("--record-parts", action="store_true", help="--two-optimizers: each step's update of each part")
    p.add_argument("--random", action="store_true", help="add noise drawn from Python's, numpy's and the "
                   "framework's generators to every batch (a resume must continue their streams)")
    p.add_argument("--compile", action="store_true", help="torch: session.setup(torch.compile(model))")
    p.add_argument("--count-syncs", action="store_true", help="torch: count the calls that make the host wait for "
                   "the device (item, float, bool, tolist, cpu, numpy, ...) inside backward + step, per step")
    p.add_argument("--out", required=True, help="rank 0 writes what the test checks here (JSON + weights .npz)")
    a = p.parse_args()

    keys = {k: yaml.safe_load(v) for k, _, v in (item.partition("=") for item in a.set)}
    session = toolkit.start(framework=a.framework, batch_size=a.batch_size, accumulation_steps=a.accumulation_steps,
                            optimizer="sgd", momentum=a.momentum, lr=a.lr, checkpoint_dir=a.checkpoint_dir,
                            resume=a.resume, **keys)
    with session.scope():
        model = plain_model(a.framework) if a.no_bn else user_code.build(session.config)
    if a.two_optimizers:
        return two_optimizers(session, a)
    if a.compile:
        import torch
        model = torch.compile(model)
    model, optimizer = session.setup(model)
    initial = [d for per in session.allgather_object(session.local_digests, name="initial") for d in per]
    data, n = indexed(a.framework)
    loader = session.loader(data)
    start = session.load()["epoch"] if a.resume else 0
    seen, steps = {}, session.global_step
    if a.train_step or a.record_steps or a.poison_step >= 0:
        return stepwise(session, loader, a, initial, seen, n)
    counter = SyncCounter() if a.count_syncs else contextlib.nullcontext()
    for epoch in range(start, a.epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            seen.setdefault(epoch, []).extend(int(round(float(v) * n)) for v in host(x)[:, 0])
            forward = loss_and_tape(a.framework, session, model, noisy(a.framework, x) if a.random else x, y)
            with counter:
                session.backward(*forward)
                stepped = session.step()
            if stepped:
                if a.count_syncs:
                    counter.end_step()
                steps += 1
                if steps == a.save_at:
                    session.save(epoch=epoch)
                    if steps == a.stop_at:
                        return finish(session, a, initial, seen, n)
    return finish(session, a, initial, seen, n, **({"syncs": counter.steps} if a.count_syncs else {}))


def two_optimizers(session, a) -> int:
    """One loss over a backbone and a head with their own optimizers (Horovod's two DistributedOptimizers or
    DistributedTrainers, or DDP twice), as a plain loop steps them: backward once, then each optimizer.
    `--record-parts`: each step's update of each part, |w_after - w_before| / lr (momentum 0: the norm of
    the gradient its optimizer applied)."""
    modules, optimizers, backward, weights_of = {"torch": torch_parts, "tensorflow": keras_parts,
                                                 "mxnet": gluon_parts}[a.framework](session, a)
    data, _ = indexed(a.framework)
    loader = session.loader(data)
    updates = []
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            before = [weights_of(m) for m in modules]
            backward(x, y)
            if a.two_optimizers == "named":
                stepped = [session.step(optimizers[-1]), session.step(optimizers[0])]    # any order, each once
                assert stepped[0] == stepped[1], stepped
                stepped = stepped[0]
            else:
                stepped = session.step()
            if stepped and a.record_parts:
                updates.append([float(np.sqrt(sum(((w1 - w0).astype(np.float64) ** 2).sum()
                                                  for w0, w1 in zip(b, weights_of(m))))) / a.lr
                                for b, m in zip(before, modules)])
    weights = [w for m in modules for w in weights_of(m)]
    return two_optimizers_done(session, a, weights, updates=updates)


def torch_parts(session, a):
    """(modules, optimizers, backward(x, y), weights_of) of torch's backbone and head (or the whole)."""
    import torch
    import torch.nn.functional as F
    model = plain_model("torch")

    def sgd(module):
        return torch.optim.SGD(module.parameters(), lr=a.lr, momentum=a.momentum)
    if a.two_optimizers == "one":
        whole, optimizer = session.setup(model, sgd(model))
        modules, optimizers, forward = [whole], [optimizer], whole
    else:
        backbone, opt_backbone = session.setup(model[:2], sgd(model[:2]))
        head, opt_head = session.setup(model[2:], sgd(model[2:]))
        modules, optimizers = [backbone, head], [opt_backbone, opt_head]

        def forward(x):
            return head(backbone(x))
    return (modules, optimizers, lambda x, y: session.backward(F.cross_entropy(forward(x), y)),
            lambda m: [p.detach().cpu().numpy().copy() for p in m.parameters()])


def keras_parts(session, a):
    """The same in Keras 3: a backbone model and a head model, or one Sequential of both."""
    import keras
    import tensorflow as tf
    with session.scope():
        backbone = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu")])
        head = keras.Sequential([keras.Input((32,)), keras.layers.Dense(4)])

    def sgd():
        with session.scope():
            return keras.optimizers.SGD(learning_rate=a.lr, momentum=a.momentum)
    if a.two_optimizers == "one":
        with session.scope():
            whole = keras.Sequential([keras.Input((16,)), backbone, head])
        whole, optimizer = session.setup(whole, sgd())
        modules, optimizers, forward = [whole], [optimizer], whole
    else:
        backbone, opt_backbone = session.setup(backbone, sgd())
        head, opt_head = session.setup(head, sgd())
        modules, optimizers = [backbone, head], [opt_backbone, opt_head]

        def forward(x):
            return head(backbone(x, training=True), training=True)

    def backward(x, y):
        with tf.GradientTape() as tape:
            logits = forward(x)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        session.backward(loss, tape)
    return modules, optimizers, backward, lambda m: [v.numpy() for v in m.trainable_variables]


def gluon_parts(session, a):
    """The same in Gluon (two Trainers)."""
    import mxnet as mx
    from mxnet import autograd, gluon
    model = plain_model("mxnet")

    def sgd():
        return mx.optimizer.SGD(learning_rate=a.lr, momentum=a.momentum)
    model.initialize(mx.init.Xavier())      # here, so both cases start from the same draws (setup() reseeds)
    if a.two_optimizers == "one":
        whole, trainer = session.setup(model, sgd())
        modules, optimizers, forward = [whole], [trainer], whole
    else:
        backbone, opt_backbone = session.setup(model[:1], sgd())
        head, opt_head = session.setup(model[1:], sgd())
        modules, optimizers = [backbone, head], [opt_backbone, opt_head]

        def forward(x):
            return head(backbone(x))
    cross_entropy = gluon.loss.SoftmaxCrossEntropyLoss()

    def backward(x, y):
        with autograd.record():
            loss = cross_entropy(forward(x), y)
        session.backward(loss)
    return modules, optimizers, backward, lambda m: [p.data().asnumpy().copy() for p in m.collect_params().values()]


def two_optimizers_done(session, a, weights, **extra) -> int:
    """The final weights (of the modules setup() shares) and every rank's digest of them, written by rank 0."""
    import hashlib
    digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()[:16]
    digests = session.allgather_object(digest, name="two_optimizers")
    if session.is_main:
        np.savez(a.out + ".npz", *weights)
        Path(a.out).write_text(json.dumps({"final_digests": digests, "steps": session.global_step, **extra}))
    session.close()
    return 0


def stepwise(session, loader, a, initial, seen, n) -> int:
    """Whole steps, with session.train_step or backward/step, recording each one's applied update
    and the reduced gradient norm the session measured."""
    updates, norms = [], []
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        for batches in loader.steps():
            before = session.weights()
            if a.train_step:
                session.train_step(batches)
            else:
                scale = float("inf") if session.global_step == a.poison_step else 1.0
                for x, y in batches:
                    session.backward(*loss_and_tape(a.framework, session, session.model, x, y, scale))
                assert session.step()
            if a.record_steps:
                delta = [w1 - w0 for w0, w1 in zip(before, session.weights())]
                updates.append(float(np.sqrt(sum(float((d.astype(np.float64) ** 2).sum()) for d in delta))) / a.lr)
                norms.append(None if session.grad_norm is None else session.to_float(session.grad_norm))
    return finish(session, a, initial, seen, n, updates=updates, norms=norms, skipped_steps=session.skipped_steps)


def host(tensor) -> np.ndarray:
    for read in ("asnumpy", "numpy", "cpu"):
        if hasattr(tensor, read):
            out = getattr(tensor, read)()
            return out if isinstance(out, np.ndarray) else out.numpy()
    return np.asarray(tensor)


def noisy(framework: str, x):
    """x plus noise drawn from every generator a loop may use: Python's, numpy's and the framework's
    (torch's global generator; Keras 3's global seed generator; MXNet's)."""
    import random
    shift = 0.01 * random.random() + 0.01 * float(np.random.standard_normal())
    if framework == "torch":
        import torch
        return x + shift + 0.01 * torch.randn_like(x)
    if framework == "tensorflow":
        import keras
        return x + shift + 0.01 * keras.random.normal(x.shape)
    import mxnet as mx
    return x + shift + 0.01 * mx.nd.random.normal(shape=x.shape, ctx=x.context)


def loss_and_tape(framework: str, session, model, x, y, scale: float = 1.0):
    """The user's forward pass, as each framework writes it: (loss,) or (loss, tape)."""
    if framework == "torch":
        import torch.nn.functional as F
        model.train()
        with session.autocast():
            return (F.cross_entropy(model(x), y) * scale,)
    if framework == "tensorflow":
        import keras
        import tensorflow as tf
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)) * scale
        return loss, tape
    from mxnet import autograd, gluon
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(model(x), y) * scale
    return (loss,)


def finish(session, a, initial, seen, n, **extra) -> int:
    seen_all = session.allgather_object(seen, name="seen")
    final = session.check_replicas()
    weights = session.weights()
    state = session.replica_parameters()[0]     # parameters and buffers (BatchNorm's statistics)
    if session.is_main:
        np.savez(a.out + ".npz", *weights)
        np.savez(a.out + ".state.npz", *state)
        Path(a.out).write_text(json.dumps({"initial_digests": initial, "final_digests": final, "n": n,
                                           "seen": seen_all, "steps": session.global_step,
                                           "summary": session.communication.summary(), **extra}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
