"""MXNet Gluon through Horovod: `hvd.DistributedTrainer`, plus what its API lacks.

MXNet 1.9.1 is the last release (the project is retired upstream). Horovod's MXNet API has no
`backward_passes_per_step` and no `op`: the toolkit supplies both here. Accumulation sums
`accumulation_steps` micro-batches into the gradients (`grad_req='add'`), then allreduces and
steps once; `op: sum` is the average times the world size, passed through `Trainer.step`'s batch
size. Adasum is refused at config time (see toolkit/registry.py). With the toolkit's exchange
(compression bf16/int8/topk, local SGD) the trainer is a plain local `gluon.Trainer` and
toolkit/communication.py moves the gradients through `local_gradients` / `apply_gradients`.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import toolkit.shims.toolkit_numpy_compat  # noqa: F401  numpy.bool for MXNet on numpy 1.26, before `import mxnet`
from adapters.base import Adapter, Topology, require_gpu_if_asked, start_horovod, threads_per_rank
from toolkit.config import Compression, Config, Model, Op, Optimizer

# MXNet sizes its OpenMP pool when it starts: share the cores between the ranks on this host first.
os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank()))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

PARAMS_FILE = "model.params"
STATES_FILE = "trainer.states"


def build_model(config: Config, num_features: int, num_classes: int) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    width = num_features
    if config.model is Model.MLP:
        for _ in range(config.hidden_layers):
            net.add(gluon.nn.Dense(config.hidden_size, activation="relu", in_units=width))
            width = config.hidden_size
    net.add(gluon.nn.Dense(num_classes, in_units=width))
    return net


class MxnetAdapter(Adapter):
    name = "mxnet"
    path = "horovod.mxnet DistributedTrainer"

    def init(self, config: Config, comm=None) -> Topology:
        self.hvd = hvd = start_horovod(config, "horovod.mxnet", "mxnet", comm=comm)
        has_gpu = mx.context.num_gpus() > 0
        require_gpu_if_asked(has_gpu)
        self.ctx = mx.gpu(hvd.local_rank()) if has_gpu else mx.cpu()
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), str(self.ctx))

    def build(self, config: Config, num_features: int, num_classes: int) -> None:
        mx.random.seed(config.seed + self.hvd.rank())
        self.net = build_model(config, num_features, num_classes)
        self.net.initialize(mx.init.Xavier(), ctx=self.ctx)
        self.params = self.net.collect_params()
        self.params.setattr("grad_req", "add")     # micro-batches add into the gradients
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.config = config

    def wrap(self, config: Config) -> None:
        hvd = self.hvd
        if config.optimizer is Optimizer.SGD:
            name, opts = "sgd", {"learning_rate": config.lr, "momentum": config.momentum, "wd": config.weight_decay}
        else:
            name, opts = "adam", {"learning_rate": config.lr, "wd": config.weight_decay}
        if config.toolkit_exchange:
            self.trainer = gluon.Trainer(self.params, name, opts, kvstore=None, update_on_kvstore=False)
        else:
            compression = hvd.Compression.fp16 if config.compression is Compression.FP16 else hvd.Compression.none
            self.trainer = hvd.DistributedTrainer(self.params, name, opts, compression=compression)
        # Trainer.step(n) scales gradients by 1/n and Horovod averages over ranks; for `sum`
        # (Horovod's meaning: the sum of each rank's mean gradient) scale the average back up.
        self.step_divisor = 1.0 / hvd.size() if config.op is Op.SUM else 1.0

    def broadcast(self, root: int = 0) -> None:
        self.hvd.broadcast_parameters(self.params, root_rank=root)
        # A sync point, as Horovod itself once had here (horovod PR #793): the in-place broadcasts
        # run asynchronously on MXNet's engine; the trainer's own init broadcast (in save_states /
        # the first step) must not overlap them. A rare SIGSEGV in EnqueueTensorBroadcast was seen
        # in CI without it.
        mx.nd.waitall()
        # Optimizer state (momentum, Adam moments): rank 0's, through the trainer's own format.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, STATES_FILE)
            if self.hvd.rank() == 0:
                self.trainer.save_states(path)
            blob = self.broadcast_object(Path(path).read_bytes() if self.hvd.rank() == 0 else None,
                                         name="toolkit.trainer_states")
            if self.hvd.rank() != 0:
                Path(path).write_bytes(blob)
                self.trainer.load_states(path)

    def set_lr(self, lr: float) -> None:
        self.trainer.set_learning_rate(lr)

    def _backward(self, batches) -> tuple[float, int]:
        """Sum-over-samples gradients of every micro-batch added into .grad; (mean loss, samples)."""
        total, samples = 0.0, 0
        for x, y in batches:
            xt, yt = mx.nd.array(x, ctx=self.ctx), mx.nd.array(y, ctx=self.ctx)
            with autograd.record():
                loss = self.loss_fn(self.net(xt), yt)
            loss.backward()
            total += float(loss.mean().asscalar())
            samples += len(y)
        return total / len(batches), samples

    def train_step(self, batches) -> float:
        loss, samples = self._backward(batches)
        self.trainer.step(samples * self.step_divisor)   # mean over all micro-batches, allreduced
        self.params.zero_grad()
        return loss

    def local_gradients(self, batches):
        loss, samples = self._backward(batches)
        grads = [p.grad(self.ctx).asnumpy() / samples for p in self.params.values()]
        self.params.zero_grad()
        return loss, grads

    def apply_gradients(self, grads) -> None:
        for p, g in zip(self.params.values(), grads):
            p.grad(self.ctx)[:] = mx.nd.array(g, ctx=self.ctx, dtype=g.dtype)
        self.trainer.step(1)
        self.params.zero_grad()

    def weights(self) -> list:
        return [p.data(self.ctx).asnumpy() for p in self.params.values()]

    def set_weights(self, arrays) -> None:
        for p, a in zip(self.params.values(), arrays, strict=True):
            p.set_data(mx.nd.array(a, ctx=self.ctx, dtype=a.dtype))

    def _state_arrays(self) -> list:
        arrays = [p.data(self.ctx) for p in self.params.values()]
        states = self.trainer._updaters[0].states     # optimizer slots by parameter index, made at the first step
        for index in sorted(states):
            state = states[index]
            arrays += [a for a in (state if isinstance(state, (tuple, list)) else [state]) if a is not None]
        return arrays

    def get_state(self) -> list:
        return [a.asnumpy() for a in self._state_arrays()]

    def set_state(self, arrays) -> None:
        for target, a in zip(self._state_arrays(), arrays, strict=True):
            target[:] = mx.nd.array(a, ctx=self.ctx, dtype=a.dtype)

    def evaluate(self, x, y) -> tuple[float, int, int]:
        if len(x) == 0:
            return 0.0, 0, 0
        logits = self.net(mx.nd.array(x, ctx=self.ctx))
        labels = mx.nd.array(y, ctx=self.ctx)
        loss = float(self.loss_fn(logits, labels).sum().asscalar())
        correct = int((logits.argmax(axis=1) == labels.astype("float32")).sum().asscalar())
        return loss, correct, len(y)

    def save(self, folder: Path) -> None:
        self.net.save_parameters(str(folder / PARAMS_FILE))
        self.trainer.save_states(str(folder / STATES_FILE))

    def load(self, folder: Path) -> None:
        self.net.load_parameters(str(folder / PARAMS_FILE), ctx=self.ctx)
        self.trainer.load_states(str(folder / STATES_FILE))

    def parameters(self) -> list:
        return [p.data(self.ctx).asnumpy() for p in self.params.values()]

    def allreduce(self, array, average: bool = True, name: str | None = None):
        array = np.ascontiguousarray(array)
        out = self.hvd.allreduce(mx.nd.array(array, dtype=array.dtype), average=average, name=name)
        return out.asnumpy()

    def allgather(self, array):
        array = np.ascontiguousarray(array)
        return self.hvd.allgather(mx.nd.array(array, dtype=array.dtype)).asnumpy()

    def broadcast_object(self, obj, name: str, root: int = 0):
        out = super().broadcast_object(obj, name, root)
        mx.nd.waitall()   # MXNet runs it asynchronously: the root must not move on (or exit) before it is sent
        return out
