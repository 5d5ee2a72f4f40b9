"""MXNet Gluon on Horovod: `hvd.DistributedTrainer`, plus what its API lacks.

Horovod's MXNet API has no `backward_passes_per_step` and no `op`: gradients add up over
`accumulation_steps` micro-batches (`grad_req='add'`), then one allreduce and one update
(`Trainer.update(samples)`: the mean over every sample of the k micro-batches, as one large batch);
`op: sum` is the average times the world size, passed through the update's batch size. Adasum is
refused at config time (toolkit/registry.py). With the toolkit's exchange the Trainer is a plain
local `gluon.Trainer` and toolkit/exchange/communication.py moves the gradients. A model whose
shapes Gluon defers is broadcast once they are known (adapters/mxnet/session.py, `_finish_setup`).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import gluon

from toolkit.adapters.horovod import HorovodStrategy, gpu_for_local_rank, require_gpu_if_asked
from toolkit.adapters.mxnet.strategies.common import MxnetStrategy
from toolkit.adapters.topology import Topology
from toolkit.config import Op
from toolkit.errors import ToolkitError

STATES_FILE = "trainer.states"


class MxnetHorovod(MxnetStrategy, HorovodStrategy):
    module, framework = "horovod.mxnet", "mxnet"
    path = "horovod.mxnet DistributedTrainer"
    step_divisor = 1.0

    def start(self, comm=None) -> Topology:
        hvd = self.init(comm)
        gpus = mx.context.num_gpus()
        require_gpu_if_asked(gpus > 0)
        gpu = gpu_for_local_rank(gpus, hvd.local_rank(), hvd.local_size(), self.config.allow_cpu)
        self.ctx = mx.gpu(gpu) if gpu is not None else mx.cpu()
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), str(self.ctx))

    def wrap(self, session) -> None:
        """session.optimizer (an mx.optimizer.Optimizer) becomes the Trainer of the model's parameters:
        Horovod's, or a local one for the exchange. Micro-batches add into the gradients where a step
        has several, or the exchange reads them; one micro-batch a step overwrites them (no zeroing)."""
        hvd, c = self.hvd, self.config
        session.accumulate = c.accumulation_steps > 1 or self.exchange
        for p in session.trainable():
            p.grad_req = "add" if session.accumulate else "write"
        params = {name: p for name, p in session.params.items() if p.grad_req != "null"}
        if isinstance(session.optimizer, gluon.Trainer):
            raise ToolkitError("session.setup(model, optimizer): give MXNet an mx.optimizer.Optimizer (or None for "
                               "the config's); the session makes the Trainer")
        if self.exchange:
            session.optimizer = gluon.Trainer(params, session.optimizer, kvstore=None, update_on_kvstore=False)
        else:
            compression, _ = self.reduction()      # Horovod's trainer has no op: sum is the step divisor below
            # several models: each trainer names its allreduces apart (Horovod's `prefix`), as they may be in flight together
            prefix = f"model{session.part_index}." if session.part_index else None
            session.optimizer = hvd.DistributedTrainer(params, session.optimizer, compression=compression,
                                                       prefix=prefix)
        # Trainer.update(n) scales gradients by 1/n and Horovod averages over ranks; for `sum`
        # (Horovod's meaning: the sum of each rank's mean gradient) scale the average back up.
        self.step_divisor = 1.0 / hvd.size() if c.op is Op.SUM else 1.0

    def broadcast(self, session, root: int = 0) -> None:
        """Rank `root`'s parameters and Trainer states on every rank. While Gluon defers the model's
        shapes: the root's shapes where it knows them (it loaded a checkpoint), else nothing yet (the
        model's first forward pass broadcasts, MxnetSession._finish_setup)."""
        if not session.shapes_known:
            shapes = self.broadcast_object(session.parameter_shapes() if session.rank == root else None,
                                           name="toolkit.deferred_shapes", root=root)
            if shapes is None:
                return
            session.take_shapes(shapes)
        self.hvd.broadcast_parameters(session.params, root_rank=root)
        # A sync point, as Horovod itself once had here (horovod PR #793): the in-place broadcasts
        # run asynchronously on MXNet's engine; the trainer's own init broadcast (in save_states /
        # the first step) must not overlap them. A rare SIGSEGV in EnqueueTensorBroadcast was seen
        # in CI without it.
        mx.nd.waitall()
        # Optimizer state (momentum, Adam moments): rank 0's, through the trainer's own format.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, STATES_FILE)
            if session.rank == root:
                session.optimizer.save_states(path)
            blob = self.broadcast_object(Path(path).read_bytes() if session.rank == root else None,
                                         name="toolkit.trainer_states", root=root)
            if session.rank != root:
                Path(path).write_bytes(blob)
                session.load_trainer_states(path)

    # -- the step (the facade's order: adapters/base.py Session._reduce_and_apply) ---------------------
    def reduce_loss(self, session, loss):
        return None

    def reduced_loss(self, session, pending, loss):
        """nan_guard: the step's loss averaged over the ranks, queued after the gradients' allreduces
        (often the same Horovod cycle); two names: the guard reads a step's value one step late, so
        two may be in flight."""
        name = f"toolkit.step_loss.{session.part_index}.{session.global_step % 2}"   # several models: one each
        return self.hvd.allreduce(loss.reshape((1,)), average=True, name=name) if session.size > 1 else loss

    def reduce(self, session) -> None:
        session.optimizer.allreduce_grads()

    def discard(self, session) -> None:
        """Several models: gradients a backward pass gave this model for another's step, dropped (zeroed
        where micro-batches add up, and no longer fresh, so `step()` does not count it as reached)."""
        for p in session.trainable():
            if session.accumulate:
                p.zero_grad()
            for d in p.list_data():      # Gluon keeps the flag on the parameter's array
                d._fresh_grad = False

    def reduced(self, session):
        return contextlib.nullcontext()

    # -- collectives on numpy ---------------------------------------------------------------------------
    def allreduce(self, array, average: bool = True, name: str | None = None, group=None):
        array = np.ascontiguousarray(array)
        out = self.hvd.allreduce(mx.nd.array(array, dtype=array.dtype), average=average, name=name,
                                 **self.process_set(group))
        return out.asnumpy()

    def allgather(self, array, group=None):
        array = np.ascontiguousarray(array)
        return self.hvd.allgather(mx.nd.array(array, dtype=array.dtype), **self.process_set(group)).asnumpy()

    def alltoall(self, array, splits: list[int], group=None):
        array = np.ascontiguousarray(array)
        out, _ = self.hvd.alltoall(mx.nd.array(array, dtype=array.dtype), splits=mx.nd.array(splits, dtype="int32"),
                                   **self.process_set(group))
        return out.asnumpy()

    def broadcast_object(self, obj, name: str, root: int = 0):
        out = super().broadcast_object(obj, name, root)
        mx.nd.waitall()   # MXNet runs it asynchronously: the root must not move on (or exit) before it is sent
        return out
