"""torch on Horovod: `hvd.DistributedOptimizer` with compression, accumulation and op.

One GPU per local rank, else the CPU. The optimizer is wrapped in Horovod's DistributedOptimizer
(`backward_passes_per_step` = accumulation_steps), whose backward hooks start each gradient's
allreduce as soon as the backward pass has made it; the step is Horovod's documented split:
`synchronize()` (the reduce), then the facade's unscale and clipping, then `step()` under
`skip_synchronize()`. Adasum reduces updates, not gradients: its step stays whole (clipping and
fp16 are refused with it). With the toolkit's exchange the optimizer stays local and
toolkit/exchange/communication.py moves the gradients over `allgather` / `allreduce` here.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from toolkit.adapters.horovod import (
    CPU_FUSION_THRESHOLD_MB,
    HorovodStrategy,
    gpu_for_local_rank,
    require_gpu_if_asked,
    threads_per_rank,
)
from toolkit.adapters.topology import Topology
from toolkit.adapters.torch.strategies.common import TorchStrategy
from toolkit.config import Op


class TorchHorovod(TorchStrategy, HorovodStrategy):
    module, framework = "horovod.torch", "torch"
    path = "horovod.torch DistributedOptimizer"

    def start(self, comm=None) -> Topology:
        config = self.config
        has_gpu = torch.cuda.is_available()
        # measured on torch only (docs/BENCHMARKS.md); GPUs keep Horovod's default for NCCL
        hvd = self.init(comm, default_fusion_mb=None if has_gpu else CPU_FUSION_THRESHOLD_MB)
        torch.set_num_threads(threads_per_rank())
        require_gpu_if_asked(has_gpu)
        gpu = gpu_for_local_rank(torch.cuda.device_count() if has_gpu else 0, hvd.local_rank(), hvd.local_size(),
                                 config.allow_cpu)
        if gpu is not None:
            torch.cuda.set_device(gpu)
            self.device = torch.device("cuda", gpu)
        else:
            self.device = torch.device("cpu")
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), str(self.device))

    def sync_batchnorm(self, model):
        """Every BatchNorm's statistics over every rank's batch (adapters/torch/batchnorm.py)."""
        from toolkit.adapters.torch import batchnorm
        hvd = self.hvd
        return batchnorm.convert(model, lambda t, name: hvd.allreduce(t, op=hvd.Sum, name=name), hvd.size)

    def wrap(self, session) -> None:
        if self.exchange:
            return
        compression, op = self.reduction()
        # Horovod names each gradient's allreduce after its parameter: a second model's names are
        # prefixed, or a GAN's generator and discriminator ("0.weight" both) would collide in flight.
        prefix = f"model{session.part_index}." if session.part_index else ""
        session.optimizer = self.hvd.DistributedOptimizer(
            session.optimizer, named_parameters=[(prefix + n, p) for n, p in session.model.named_parameters()],
            compression=compression, backward_passes_per_step=self.config.accumulation_steps, op=op)

    def broadcast(self, session, root: int = 0) -> None:
        """The root's optimizer state, then its parameters. Horovod's broadcast_optimizer_state fills an
        empty state with a step on zero gradients (Adam's step count starts at 1, weight decay applied
        once): a fresh optimizer (empty on the root) shares only its hyperparameters, as DDP starts, so
        both engines train the same script alike; a loaded one (a resume) goes through Horovod's, before
        the parameters are made equal (its zero step on the other ranks must not touch them after)."""
        optimizer = session.optimizer
        if session.broadcast_object(bool(optimizer.state_dict()["state"]), name="toolkit.optimizer_state", root=root):
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=root)
        else:
            options = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
            for group, chosen in zip(optimizer.param_groups,
                                     session.broadcast_object(options, name="toolkit.optimizer_options", root=root)):
                group.update(chosen)
        self.hvd.broadcast_parameters(session.model.state_dict(), root_rank=root)

    def discard(self, session) -> None:
        """Horovod's hooks started allreduces of this model's gradients in another model's backward
        pass (the same ones on every rank): finished, then dropped, so the next backward starts clean."""
        if not self.exchange and session.optimizer._handles:
            session.optimizer.synchronize()
        session.optimizer.zero_grad()

    # -- the step (the facade's order: adapters/base.py Session._reduce_and_apply) ---------------------
    @property
    def _whole(self) -> bool:
        return self.config.op is Op.ADASUM

    def reduce_loss(self, session, loss):
        """nan_guard: the step's loss averaged over the ranks, queued before the gradients' last
        allreduces finish (the same Horovod cycle, 4 more bytes)."""
        if session.size == 1:
            return None
        return self.hvd.allreduce_async(loss.float().reshape(1), op=self.hvd.Average, name="toolkit.step_loss")

    def reduced_loss(self, session, pending, loss):
        return self.hvd.synchronize(pending) if pending is not None else loss

    def reduce(self, session) -> None:
        if not self._whole:
            session.optimizer.synchronize()

    def reduced(self, session):
        """The optimizer's step without a second reduce."""
        return contextlib.nullcontext() if self._whole else session.optimizer.skip_synchronize()

    # -- collectives on numpy arrays (returned as numpy) or on tensors (returned as tensors, on their device) --
    def allreduce(self, array, average: bool = True, name: str | None = None, group=None):
        tensor = array if torch.is_tensor(array) else torch.from_numpy(np.ascontiguousarray(array))
        out = self.hvd.allreduce(tensor, op=self.hvd.Average if average else self.hvd.Sum, name=name,
                                 **self.process_set(group))
        return out if torch.is_tensor(array) else out.numpy()

    def allgather(self, array, group=None):
        tensor = array if torch.is_tensor(array) else torch.from_numpy(np.ascontiguousarray(array))
        out = self.hvd.allgather(tensor, **self.process_set(group))
        return out if torch.is_tensor(array) else out.numpy()

    def alltoall(self, array, splits: list[int], group=None):
        tensor = array if torch.is_tensor(array) else torch.from_numpy(np.ascontiguousarray(array))
        out, _ = self.hvd.alltoall(tensor, splits=torch.tensor(splits, dtype=torch.int32), **self.process_set(group))
        return out if torch.is_tensor(array) else out.numpy()
