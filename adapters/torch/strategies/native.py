"""torch on its own engine: a torch.distributed process group and DistributedDataParallel (or FSDP2 / ZeRO).

`backend: native` for torch. The process group (Gloo on the CPU, NCCL on a GPU; object and numpy
collectives over Gloo always) is initialised from whichever launcher started the ranks
(adapters/torch/rendezvous.py: torchrun, horovodrun, mpirun, srun). One GPU per local rank, as on Horovod.

- The model is wrapped in `DistributedDataParallel` (buffers not broadcast each forward: BatchNorm
  statistics are averaged where the toolkit averages them, as on Horovod); its hooks allreduce each
  gradient bucket during the backward pass, so `reduce` has nothing left to do. Accumulation sets
  DDP's own `require_backward_grad_sync` (what `no_sync()` sets) before each micro-batch's forward.
- compression fp16, bf16 and powersgd are DDP's own comm hooks (adapters/torch/comm_hooks.py; PowerSGD on
  Gloo with one gradient bucket, the only way torch 2.14's hook works there); int8, top-k, DGC and local
  SGD (and PowerSGD for a model DDP's hook cannot take) run the toolkit's exchange on this strategy's
  collectives (the model then stays unwrapped: the exchange moves the whole step's gradients itself).
- sharding (adapters/torch/sharding.py): zero1 = torch's ZeroRedundancyOptimizer under DDP; fsdp =
  FSDP2 `fully_shard` per block.
- uneven data: DDP's `Join` (the ranks that ran out shadow the others' allreduces with zeros), entered
  when the config sets `uneven_data`, left in `join()`.
"""
from __future__ import annotations

import atexit
import inspect
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from toolkit.adapters.horovod import gpu_for_local_rank, require_gpu_if_asked, threads_per_rank
from toolkit.adapters.strategy import Strategy
from toolkit.adapters.topology import Topology
from toolkit.adapters.torch import comm_hooks, rendezvous, sharding
from toolkit.adapters.torch.strategies.common import TorchStrategy
from toolkit.config import Sharding
from toolkit.errors import ToolkitError

# BatchNorm statistics not broadcast from rank 0 before every forward (the toolkit averages them where
# Horovod's path does); torch 2.14 renamed the flag (the old name warns), 2.13 has the old one only.
NO_FORWARD_BUFFER_SYNC: dict[str, Any] = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                          inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
                          else {"broadcast_buffers": False})


class TorchNative(TorchStrategy, Strategy):
    name = "native"
    collectives = "torch.distributed's"
    groups = True

    def __init__(self, config):
        super().__init__(config)
        self.hook = comm_hooks.chosen(config)     # DDP's own hook for the compression (adapters/torch/comm_hooks.py)
        self.exchange = config.toolkit_exchange and self.hook is None
        self.sharding = config.sharding
        self.join_context = None
        self.steps = 0
        self._stash = None          # a checkpoint's state read on rank 0, shared by the next broadcast
        self._groups: dict = {}     # new_group's, by ranks: made once (the auto probe's are the exchange's)

    def reconfigure(self, config) -> None:
        super().reconfigure(config)
        self.hook = comm_hooks.chosen(config)
        self.exchange = config.toolkit_exchange and self.hook is None

    # -- start ----------------------------------------------------------------------------------------
    def start(self, comm=None) -> Topology:
        if comm is not None:
            raise ToolkitError("backend=native runs torch.distributed, not Horovod on an MPI communicator; "
                               "the parameter server needs backend: horovod")
        where = rendezvous.place()
        torch.set_num_threads(threads_per_rank(where.local_size))
        has_gpu = torch.cuda.is_available()
        require_gpu_if_asked(has_gpu)
        gpu = gpu_for_local_rank(torch.cuda.device_count() if has_gpu else 0, where.local_rank, where.local_size,
                                 self.config.allow_cpu)
        if gpu is not None:
            torch.cuda.set_device(gpu)
            self.device = torch.device("cuda", gpu)
        else:
            self.device = torch.device("cpu")
        self.backend = "nccl" if gpu is not None else "gloo"
        if not dist.is_initialized():    # a user's script may have made the group itself
            dist.init_process_group(self.backend, init_method=rendezvous.init_method(where), rank=where.rank,
                                    world_size=where.size, timeout=timedelta(minutes=10),
                                    device_id=self.device if gpu is not None else None)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        atexit.register(_shutdown)
        # numpy arrays and pickled objects cross on the CPU: Gloo, beside NCCL where NCCL moves the gradients
        # every rank is a member: never new_group's NON_GROUP_MEMBER
        self.cpu_group: dist.ProcessGroup | None = (dist.new_group(backend="gloo")  # type: ignore[assignment]
                                                    if self.backend != "gloo" else None)
        self.launcher = where.launcher
        return Topology(self.rank, self.size, where.local_rank, where.local_size, str(self.device))

    def restarted(self) -> bool:
        """torchrun restarted the workers (`--max-restarts`, `toolkit launch --backend native --min-np`)."""
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0

    @property
    def path(self) -> str:              # type: ignore[override]  # a property over Strategy's plain attribute
        engine = {Sharding.NONE: "DistributedDataParallel", Sharding.ZERO1: "DistributedDataParallel + "
                  "ZeroRedundancyOptimizer", Sharding.FSDP: "FSDP2 fully_shard"}[self.sharding]
        if self.exchange:
            engine = "no wrapper (the toolkit's exchange)"
        hook = f", {self.hook}" if self.hook else ""
        return f"torch.distributed {engine} ({self.backend}{hook})"

    def sync_batchnorm(self, model):
        """torch's own SyncBatchNorm on a GPU; on the CPU (torch's has no CPU kernels) the toolkit's,
        over torch.distributed's differentiable all_reduce."""
        if self.device.type == "cuda":
            return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        from torch.distributed.nn import functional as dist_nn

        from toolkit.adapters.torch import batchnorm
        return batchnorm.convert(model, lambda t, name: dist_nn.all_reduce(t), lambda: self.size)

    # -- the user's objects -----------------------------------------------------------------------------
    def wrap(self, session) -> None:
        model = session.model
        if isinstance(model, torch.nn.DataParallel):
            from toolkit.config.rules import DATAPARALLEL
            raise ToolkitError(f"session.setup(model): a torch.nn.DataParallel is refused: {DATAPARALLEL}; pass "
                               "the module inside it (model.module): backend native wraps it in DDP")
        if self.hook and not comm_hooks.fits(self.hook, model, self.backend):
            self.hook, self.exchange = None, True      # DDP's PowerSGD cannot here: the toolkit's
        if self.exchange:
            return
        if self.sharding is Sharding.FSDP:
            session.model, session.optimizer = sharding.fully_shard(session, self)
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP
            session.model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                                **NO_FORWARD_BUFFER_SYNC, **comm_hooks.ddp_options(self.hook, model, self.backend))
            if self.hook:
                comm_hooks.register(session.model, self.hook, self.config)
            if self.sharding is Sharding.ZERO1:
                session.optimizer = sharding.zero1(session.optimizer)
            if self.config.data_fractions():
                from torch.distributed.algorithms.join import Join
                self.join_context = Join([session.model])
        self.sync_gradients(session, self.config.accumulation_steps == 1)


    @property
    def wraps_module(self) -> bool:
        return not self.exchange

    def sync_gradients(self, session, on: bool) -> None:
        model = session.model
        if hasattr(model, "require_backward_grad_sync"):        # DDP: read by the next forward
            model.require_backward_grad_sync = on
        elif hasattr(model, "set_requires_gradient_sync"):      # FSDP2: read by the backward pass
            model.set_requires_gradient_sync(on)

    def communication(self, session):
        from toolkit.exchange import communication
        if self.exchange:
            return communication.for_session(self.config, session, exchange=True)
        model = self.unwrap(session.model)
        grads = comm_hooks.step_bytes(self.hook, self.config, model)     # the gradients' reduction
        extra = sharding.extra_bytes_per_value(self.config, self.size) * \
            sum(p.numel() for p in model.parameters() if p.requires_grad)
        reduce = "reducescatter" if self.sharding is Sharding.FSDP else "allreduce"
        return communication.for_session(           # zero1's and fsdp's parameter shares travel as allgathers
            self.config, session, exchange=False,
            step_calls=lambda step: [(reduce, grads(step))] + ([("allgather", extra)] if extra else []))

    def full_state(self, part) -> dict:
        if self.sharding is Sharding.NONE:
            return super().full_state(part)
        return sharding.full_state(part, self)

    def stash_loaded(self, part, state: dict) -> None:
        if self.sharding is Sharding.NONE:
            return super().stash_loaded(part, state)
        self._stash = state

    def broadcast(self, session, root: int = 0) -> None:
        """Rank `root`'s model and optimizer state on every rank (setup: DDP's constructor has already
        copied rank 0's parameters; resume: rank 0 has loaded the checkpoint)."""
        if self.sharding is not Sharding.NONE:
            stash, self._stash = self._stash, None
            sharding.broadcast(session, self, stash)
            return
        sharding.broadcast_module(self.unwrap(session.model), root)
        state = self.broadcast_object(session.optimizer.state_dict(), name="toolkit.optimizer_state", root=root)
        if self.rank != root:
            session.optimizer.load_state_dict(state)

    def discard(self, session) -> None:
        session.optimizer.zero_grad()

    # -- the step (the facade's order: adapters/base.py Session._reduce_and_apply) ------------------------
    def reduce_loss(self, session, loss):
        """nan_guard: the step's loss averaged over the ranks (not under Join: a rank that ran out would
        not take part)."""
        if self.size == 1 or self.join_context is not None:
            return None
        tensor = loss.detach().float().reshape(1).clone()
        return dist.all_reduce(tensor, async_op=True), tensor

    def reduced_loss(self, session, pending, loss):
        if pending is None:
            return loss
        work, tensor = pending
        work.wait()
        return tensor / self.size

    def reduce(self, session) -> None:
        """DDP (or FSDP) reduced the gradients during the backward pass."""
        self.steps += 1

    # -- collectives ------------------------------------------------------------------------------------------
    def new_group(self, ranks: list[int]) -> "Ranks":
        """torch.distributed.new_group (every rank calls it for every group, member or not), beside a Gloo one
        for tensors on the CPU where the job runs NCCL."""
        ranks = list(ranks)
        if tuple(ranks) not in self._groups:
            cpu = dist.new_group(ranks, backend="gloo") if self.backend != "gloo" else None
            self._groups[tuple(ranks)] = Ranks(ranks, dist.new_group(ranks), cpu)
        return self._groups[tuple(ranks)]

    def _group(self, tensor, group: "Ranks | None" = None):
        """(the process group for `tensor`'s device, its size): `group`'s, or every rank's."""
        cpu = tensor.device.type == "cpu"
        if group is None:
            return (self.cpu_group if cpu else None), self.size
        return (group.cpu or group.group) if cpu else group.group, len(group.ranks)

    def allreduce(self, array, average: bool = True, name: str | None = None, group=None):
        tensor = array.clone() if torch.is_tensor(array) else torch.from_numpy(np.array(array, copy=True))
        pg, size = self._group(tensor, group)
        if size > 1:
            dist.all_reduce(tensor, group=pg)
        if average:
            tensor = tensor / size if tensor.is_floating_point() else tensor // size
        return tensor if torch.is_tensor(array) else tensor.numpy()

    def allgather(self, array, group=None):
        tensor = array if torch.is_tensor(array) else torch.from_numpy(np.ascontiguousarray(array))
        pg, size = self._group(tensor, group)
        if size == 1:
            return array
        length = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
        lengths = [torch.zeros_like(length) for _ in range(size)]
        dist.all_gather(lengths, length, group=pg)
        lengths = [int(n) for n in lengths]
        longest = max(lengths)
        padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        padded[:tensor.shape[0]] = tensor
        rows = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(rows, padded, group=pg)
        out = torch.cat([row[:n] for row, n in zip(rows, lengths)])
        return out if torch.is_tensor(array) else out.numpy()

    def alltoall(self, array, splits: list[int], group=None):
        tensor = array if torch.is_tensor(array) else torch.from_numpy(np.ascontiguousarray(array))
        pg, size = self._group(tensor, group)
        if size == 1:
            return array
        sizes = torch.tensor(splits, dtype=torch.int64, device=tensor.device)
        received = torch.empty_like(sizes)
        dist.all_to_all_single(received, sizes, group=pg)        # what each rank will send this one
        counts = [int(n) for n in received]
        out = torch.empty(sum(counts), dtype=tensor.dtype, device=tensor.device)
        dist.all_to_all_single(out, tensor.contiguous(), counts, list(splits), group=pg)
        return out if torch.is_tensor(array) else out.numpy()

    def allgather_object(self, obj, name: str) -> list:
        out = [None] * self.size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def broadcast_object(self, obj, name: str, root: int = 0):
        box = [obj]
        dist.broadcast_object_list(box, src=root, group=self.cpu_group)
        return box[0]

    def join(self) -> int:
        """DDP's Join: this rank has no more batches; it shadows the others' allreduces with zeros until
        every rank is out. Returns a rank that ran the most steps (its model is the newest)."""
        if self.join_context is None:
            raise ToolkitError("session.join() on backend native needs uneven_data in the config (DDP's Join "
                               "context is entered at setup); or use backend: horovod")
        self.join_context.__exit__(None, None, None)
        steps = self.allgather_object(self.steps, name="toolkit.join_steps")
        return max(range(self.size), key=lambda r: (steps[r], r))


@dataclass(frozen=True)
class Ranks:
    """A group of ranks `new_group` made: its process group, and a Gloo one for CPU tensors beside NCCL."""
    ranks: list[int]
    group: Any
    cpu: Any = None


def _shutdown() -> None:
    """At exit, before Python tears its modules down: garbage collected and the process groups destroyed
    while the interpreter still runs. Left to the interpreter's teardown, a user's script (not the
    toolkit's own commands, which end without it) sometimes aborted after its work was done (`terminate
    called without an active exception`, exit 134: 2 and 4 of 8 2-rank runs here, 0 of 20 with this)."""
    import gc
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
