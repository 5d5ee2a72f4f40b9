"""The toolkit's step with your own model against a plain Horovod loop of the same model and data,
per framework, in one job: the table behind docs/BENCHMARKS.md ("Your model through the API").

    .venv/bin/python -m benchmarks.api_bench --frameworks torch --rounds 3        # ~2 min: print only
    .venv/bin/python -m benchmarks.api_bench --write-docs                          # all three, ~10 min

Each framework runs one job of `-np` ranks (`toolkit launch`, Gloo). Every rank builds the same MLP
(`--features` -> `--hidden-layers` x `--hidden-size` -> 10) twice: one copy goes through the
session (`toolkit.start`, `setup`, `loader` over the framework's dataset, `train_step`), the other
through the loop Horovod's own examples write (torch: `DistributedSampler` + `DataLoader` +
`hvd.DistributedOptimizer`; TensorFlow: `tf.data` `shard`/`batch` + `hvd.DistributedGradientTape` in
a `tf.function`; MXNet: a split sampler + Gluon's `DataLoader` + `hvd.DistributedTrainer`). Both
read the same synthetic samples from the framework's dataset and step the same optimizer (SGD,
momentum 0.9). They run in alternating blocks of `--steps` steps for `--rounds` rounds, in ABBA
order (drift of the machine hits both alike), each block ending with the loss read back; the table gives each
loop's median samples/s per rank and the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT


def arrays(a):
    import numpy as np
    rng = np.random.RandomState(0)
    return (rng.standard_normal((a.samples, a.features)).astype(np.float32),
            rng.randint(0, 10, a.samples).astype(np.int64))


def blocks(toolkit_block, plain_block, a) -> dict:
    """Alternating timed blocks; samples/s of each (per rank)."""
    seconds = common.alternating({"toolkit": toolkit_block, "plain": plain_block}, a.rounds)
    return {name: [a.steps * a.batch_size / t for t in times] for name, times in seconds.items()}


def cycle(make):
    """An endless iterator over epochs of `make(epoch)`."""
    epoch = 0
    while True:
        yield from make(epoch)
        epoch += 1


def session_block(session, dataset, a, wait=None):
    """A timed block of the toolkit's loop: `a.steps` train_steps on the session's loader over
    `dataset`, ending with the loss read back (and `wait()` for queued work)."""
    loader = session.loader(dataset)
    steps = cycle(lambda e: (loader.set_epoch(e), loader.steps())[1])

    def block():
        for _ in range(a.steps):
            loss = session.train_step(next(steps))
        session.to_float(loss)
        if wait:
            wait()
    return block


def torch_worker(a) -> dict:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    import toolkit

    session = toolkit.start(framework="torch", batch_size=a.batch_size, lr=0.01, momentum=0.9)
    x, y = arrays(a)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

    def mlp():
        layers, width = [], a.features
        for _ in range(a.hidden_layers):
            layers += [torch.nn.Linear(width, a.hidden_size), torch.nn.ReLU()]
            width = a.hidden_size
        return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))

    model = mlp()
    session.setup(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    toolkit_block = session_block(session, dataset, a)

    # the plain loop, as horovod/examples/pytorch/pytorch_mnist.py writes it
    plain = mlp().to(session.torch_device)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=[(f"plain.{n}", p) for n, p in plain.named_parameters()])
    hvd.broadcast_parameters(plain.state_dict(), root_rank=0)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    reader = torch.utils.data.DataLoader(dataset, batch_size=a.batch_size, sampler=sampler, drop_last=True)
    batches = cycle(lambda e: (sampler.set_epoch(e), iter(reader))[1])

    def plain_block():
        plain.train()
        for _ in range(a.steps):
            data, target = next(batches)
            data, target = data.to(session.torch_device), target.to(session.torch_device)
            optimizer.zero_grad()
            loss = F.cross_entropy(plain(data), target)
            loss.backward()
            optimizer.step()
        float(loss)

    return blocks(toolkit_block, plain_block, a) | {"device": session.device}


def tensorflow_worker(a) -> dict:
    import toolkit

    session = toolkit.start(framework="tensorflow", batch_size=a.batch_size, lr=0.01, momentum=0.9)
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    x, y = arrays(a)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))

    def mlp():
        layers = [keras.Input((a.features,))]
        layers += [keras.layers.Dense(a.hidden_size, activation="relu") for _ in range(a.hidden_layers)]
        return keras.Sequential(layers + [keras.layers.Dense(10)])

    session.setup(mlp(), keras.optimizers.SGD(learning_rate=0.01, momentum=0.9))
    toolkit_block = session_block(session, dataset, a)

    # the plain loop, as horovod/examples/tensorflow2/tensorflow2_mnist.py writes it
    plain = mlp()
    opt = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    shards = dataset.shard(hvd.size(), hvd.rank()).repeat().shuffle(10_000, seed=0).batch(a.batch_size)
    batches = iter(shards)

    opt.build(plain.trainable_variables)
    variables = [v.value for v in plain.trainable_variables]    # Horovod's TF ops take the tf.Variable underneath

    @tf.function
    def training_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, plain(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, plain.trainable_variables))
        return loss

    hvd.broadcast_variables([v.value for v in plain.variables], root_rank=0)
    hvd.broadcast_variables([v.value for v in opt.variables], root_rank=0)

    def plain_block():
        for _ in range(a.steps):
            images, labels = next(batches)
            loss = training_step(images, labels)
        float(loss)

    return blocks(toolkit_block, plain_block, a) | {"device": session.device}


def mxnet_worker(a) -> dict:
    import toolkit

    session = toolkit.start(framework="mxnet", batch_size=a.batch_size, lr=0.01, momentum=0.9)
    import horovod.mxnet as hvd
    import mxnet as mx
    from mxnet import autograd, gluon

    x, y = arrays(a)
    dataset = gluon.data.ArrayDataset(x, y.astype("float32"))

    def mlp():
        net, width = gluon.nn.HybridSequential(), a.features
        for _ in range(a.hidden_layers):
            net.add(gluon.nn.Dense(a.hidden_size, activation="relu", in_units=width))
            width = a.hidden_size
        net.add(gluon.nn.Dense(10, in_units=width))
        return net

    session.setup(mlp(), mx.optimizer.SGD(learning_rate=0.01, momentum=0.9))
    toolkit_block = session_block(session, dataset, a, wait=mx.nd.waitall)   # MXNet's update runs asynchronously

    # the plain loop, as horovod/examples/mxnet/mxnet_mnist.py writes it (its SplitSampler)
    class SplitSampler(gluon.data.sampler.Sampler):
        def __init__(self, length, parts, index):
            self.part = length // parts
            self.start = self.part * index

        def __iter__(self):
            import numpy as np
            return iter((self.start + np.random.permutation(self.part)).tolist())

        def __len__(self):
            return self.part

    ctx = session.ctx
    plain = mlp()
    plain.initialize(mx.init.Xavier(), ctx=ctx)
    params = plain.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, mx.optimizer.SGD(learning_rate=0.01, momentum=0.9), prefix="plain.")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    reader = gluon.data.DataLoader(dataset, batch_size=a.batch_size, last_batch="discard",
                                   sampler=SplitSampler(len(dataset), hvd.size(), hvd.rank()))
    batches = cycle(lambda e: iter(reader))

    def plain_block():
        for _ in range(a.steps):
            data, label = next(batches)
            data, label = data.as_in_context(ctx), label.as_in_context(ctx)
            with autograd.record():
                loss = loss_fn(plain(data), label)
            loss.backward()
            trainer.step(a.batch_size)
        loss.mean().asscalar()
        mx.nd.waitall()

    return blocks(toolkit_block, plain_block, a) | {"device": session.device}


WORKERS = {"torch": torch_worker, "tensorflow": tensorflow_worker, "mxnet": mxnet_worker}


def worker(a) -> int:
    rates = WORKERS[a.worker](a)
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if rank == 0:
        Path(a.result).write_text(json.dumps(rates))
    return 0


def table(results: dict, a) -> str:
    rows = []
    for fw, r in results.items():
        if "failed" in r:
            rows.append(f"| {fw} | - | failed: {r['failed']} | | |")
            continue
        t, p = statistics.median(r["toolkit"]), statistics.median(r["plain"])
        rows.append([fw, r["device"], f"{t:,.0f}", f"{p:,.0f}", f"{t / p:.3f}x"])
    return (f"Made by `.venv/bin/python -m benchmarks.api_bench -np {a.np} --features {a.features} --hidden-size "
            f"{a.hidden_size} --hidden-layers {a.hidden_layers} --batch-size {a.batch_size} --steps {a.steps} "
            f"--rounds {a.rounds} --write-docs` on {common.today()}, {common.cores()}, {a.np} ranks (Gloo), "
            f"{a.samples} synthetic samples; median over rounds of samples/s per rank.\n\n"
            + common.table(["framework", "device", "toolkit (session: loader + train_step)", "plain Horovod loop",
                            "toolkit / plain"], rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frameworks", default="torch,tensorflow,mxnet", help="comma separated (default: all three)")
    p.add_argument("-np", dest="np", type=int, default=2, help="ranks per job (default 2)")
    p.add_argument("--features", type=int, default=1024, help="MLP input width (default 1024)")
    p.add_argument("--hidden-size", type=int, default=1024, help="MLP hidden width (default 1024)")
    p.add_argument("--hidden-layers", type=int, default=2, help="MLP hidden layers (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per step (default 64)")
    p.add_argument("--samples", type=int, default=8192, help="synthetic samples in the dataset (default 8192)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed block (default 20)")
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds (ABBA); each loop reports its median "
                   "(default 8)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per job (default 900)")
    p.add_argument("--write-docs", action="store_true", help="also write the table into docs/BENCHMARKS.md")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    results = {}
    for fw in a.frameworks.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "result.json"
            args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                    if k in ("features", "hidden_size", "hidden_layers", "batch_size", "samples", "steps", "rounds")]
            argv = [sys.executable, "-m", "toolkit", "launch", "-np", str(a.np), "--gloo", "--timeout",
                    str(a.timeout), "--", sys.executable, "-m", "benchmarks.api_bench", "--worker", fw, "--result",
                    str(result), *args]
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            results[fw] = json.loads(result.read_text()) if proc.returncode == 0 and result.is_file() else \
                {"failed": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
            print(f"{fw}: {results[fw] if 'failed' in results[fw] else 'done'}", file=sys.stderr, flush=True)
    text = table(results, a)
    print(text)
    if a.write_docs:
        common.write_between("BENCHMARKS.md", "api", text)
    return 1 if any("failed" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
