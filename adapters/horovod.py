"""What every Horovod strategy shares (torch, TensorFlow, MXNet: adapters/<framework>/strategies/horovod.py):
its tuning variables, the import of `horovod.<framework>` with a one-line fix when the build lacks
it, `hvd.init()` (on an mpi4py communicator when given), the op check, the GPU per local rank, the
config's compression and op as Horovod's, and the collectives that are the same in every framework
(objects, join, elastic).
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from toolkit.adapters.strategy import Strategy
from toolkit.errors import ToolkitError
from toolkit.install import support
from toolkit.tuning import tuning_env


def import_horovod(module: str, framework: str):
    """`import horovod.<fw>`, turning a missing or partial Horovod build into a one-line fix."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        if "has not been built" in text or "mpi_lib" in text:
            raise ToolkitError(f"Horovod was built without {framework} support ({text}); rebuild it "
                               f"with {support.fix(f'toolkit build-horovod --frameworks {framework}')}") from None
        if getattr(e, "name", None) == "horovod":
            raise ToolkitError(f"Horovod is not installed in this Python; build it with "
                               f"{support.fix(f'toolkit build-horovod --frameworks {framework}')}") from None
        raise ToolkitError(f"cannot import {module}: {text}; run `toolkit doctor` for the fix") from None


# Horovod's fusion buffer when training on CPUs and nobody chose one: Horovod's 128 MiB copies every
# gradient into the buffer and back; on CPU cores that copying costs more than the one fused
# operation saves once tensors are a few MiB (docs/BENCHMARKS.md, "fusion": torch, 10.5M-parameter
# MLP, 2 ranks: 128 -> 4 MiB was ~1.4x the throughput over Gloo and 1.0-1.1x over MPI).
CPU_FUSION_THRESHOLD_MB = 4


def apply_horovod_tuning(config, default_fusion_mb: float | None = None) -> None:
    """Fusion threshold, cycle time, timeline and stall check from the config, set before
    `hvd.init()` reads them (Horovod's own environment variables, written by the same
    `toolkit.tuning.tuning_env` as `toolkit launch`'s flags, so both agree).
    `default_fusion_mb` applies only when neither the config nor the environment sets a threshold."""
    fusion_mb = config.fusion_threshold_mb
    if fusion_mb is None and "HOROVOD_FUSION_THRESHOLD" not in os.environ:
        fusion_mb = default_fusion_mb
    if config.timeline_file:        # Horovod does not create the timeline's folder
        Path(config.timeline_file).resolve().parent.mkdir(parents=True, exist_ok=True)
    os.environ.update(item.split("=", 1) for item in   # type: ignore[misc]  # each item is KEY=VALUE
                      tuning_env(fusion_mb, config.cycle_time_ms, timeline=config.timeline_file))
    if config.stall_check_seconds == 0:
        os.environ["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    elif config.stall_check_seconds is not None:
        os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(int(config.stall_check_seconds))


def _launcher_count(names: tuple[str, ...]) -> int | None:
    """The first of the launchers' variables `names` set to a positive count (before hvd.init), or None."""
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def launcher_local_size() -> int:
    """Ranks on this host, from the launcher's environment (for settings made before hvd.init)."""
    return _launcher_count(("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                            "SLURM_NTASKS_PER_NODE")) or 1


def launcher_size() -> int | None:
    """Ranks in the job, from the launcher's environment (before hvd.init); None where no launcher says."""
    return _launcher_count(("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"))


def threads_per_rank(local_size: int | None = None) -> int:
    """This host's cores shared between its ranks (known before hvd.init, as MXNet and TF need)."""
    return max(1, (os.cpu_count() or 1) // (local_size or launcher_local_size()))


def start_horovod(config, module: str, framework: str, default_fusion_mb: float | None = None, comm=None):
    """Tuning from the config, `import horovod.<fw>`, hvd.init(), the op checked: every Horovod session's start.
    `comm`: an mpi4py communicator Horovod runs on instead of every rank (e.g. the parameter-server
    job's workers, toolkit/run/ps.py, or a program that already uses MPI)."""
    apply_horovod_tuning(config, default_fusion_mb)
    hvd = import_horovod(module, framework)
    sets = {"process_sets": "dynamic"} if _dynamic(config) and comm is None else {}
    hvd.init(comm=comm, **sets) if comm is not None else hvd.init(**sets)
    check_op(hvd, config)
    return hvd


def _dynamic(config) -> bool:
    """Whether Horovod starts with dynamic process sets: where the exchange is to be hierarchical
    (toolkit/exchange/hierarchy.py), so that its groups can be made once the topology is known: asked for,
    or (unset) the launcher starts several hosts of several ranks. Not otherwise: every collective of a
    Horovod started with dynamic process sets pays for them (2 ranks here, an allreduce of 1,000 values:
    3.7 ms against 2.7 ms, medians of 3 alternating runs of 200)."""
    if config.hierarchical_exchange is False or not config.hierarchical_capable:
        return False
    if config.hierarchical_exchange:
        return True
    size, local = launcher_size(), launcher_local_size()
    return size is not None and 1 < local < size


def check_op(hvd, config) -> None:
    """What Horovod's Adasum needs, checked after hvd.init() instead of failing inside a step."""
    if config.op.value != "adasum":
        return
    if not hvd.mpi_enabled():
        raise ToolkitError("op=adasum needs Horovod's MPI controller (Horovod has no Adasum over Gloo); "
                           "launch with `horovodrun --mpi` or mpirun, or use op: average")
    if hvd.size() & (hvd.size() - 1):
        raise ToolkitError(f"op=adasum needs a power-of-2 number of ranks, got {hvd.size()}; "
                           "change -np or use op: average")


def require_gpu_if_asked(has_gpu: bool) -> None:
    """TOOLKIT_REQUIRE_GPU=1 turns the CPU fallback into an error (GPU machines, GPU tests)."""
    if os.environ.get("TOOLKIT_REQUIRE_GPU") == "1" and not has_gpu:
        raise ToolkitError("TOOLKIT_REQUIRE_GPU=1 but the framework sees no GPU: check `nvidia-smi` (the driver), "
                           "CUDA_VISIBLE_DEVICES (empty or a wrong index hides every GPU) and that the framework is "
                           "a CUDA build (`toolkit doctor` shows its GPU count; a CPU-only wheel sees none); or "
                           "unset TOOLKIT_REQUIRE_GPU to run on the CPU")


def gpu_for_local_rank(gpus: int, local_rank: int, local_size: int, allow_cpu: bool) -> int | None:
    """The GPU this rank pins (its local rank), None for the CPU; more ranks on this host than GPUs
    is one line with the counts and the fix (CUDA would say `invalid device ordinal`)."""
    if not gpus:
        return None
    if local_size > gpus:
        if allow_cpu:
            return None
        raise ToolkitError(f"{local_size} ranks on this host but {gpus} GPU(s): one GPU per rank; launch at most "
                           f"{gpus} rank(s) per host (-H host:{gpus}), or set allow_cpu: true to train these ranks "
                           "on the CPU")
    return local_rank


def reduction(hvd, config):
    """(compression, op) of Horovod's module `hvd` for the config: Horovod's fp16 compressor or none,
    and Average / Sum / Adasum. The one mapping from config to Horovod, for every session."""
    from toolkit.config import Compression, Op
    compression = hvd.Compression.fp16 if config.compression is Compression.FP16 else hvd.Compression.none
    return compression, {Op.AVERAGE: hvd.Average, Op.SUM: hvd.Sum, Op.ADASUM: getattr(hvd, "Adasum", None)}[config.op]


def allreduce_gradients(hvd, grads, op, compression) -> list:
    """One allreduce per gradient, as Horovod's DistributedGradientTape does: Horovod fuses them in
    its cycle, and each can start as soon as the backward pass has made its gradient. One grouped
    allreduce (`hvd.grouped_allreduce`, used before) waits for every gradient first: on ResNet-50
    (2 ranks, this CPU) it ran 0.95x the plain Horovod script, per tensor 0.995x (docs/BENCHMARKS.md).
    (Adasum's grouped form also fails in Horovod 0.28.1: `UnboundLocalError: 'tensor'`.)"""
    return [hvd.allreduce(g, op=op, compression=compression) for g in grads]


class HorovodStrategy(Strategy):
    """Horovod's part of every framework's Horovod strategy; a subclass names its module and adds
    the framework's device, optimizer wrapping, broadcast and array collectives."""
    name = "horovod"
    groups = False          # process sets: where Horovod starts with dynamic ones (`init`, `_dynamic`)
    module = framework = ""      # "horovod.torch", "torch"
    hvd: Any = None

    def init(self, comm=None, default_fusion_mb: float | None = None):
        """Tuning, `import horovod.<fw>`, hvd.init() on `comm` or every rank, the op checked."""
        self.hvd = start_horovod(self.config, self.module, self.framework, default_fusion_mb, comm=comm)
        self.groups = _dynamic(self.config) and comm is None
        self.process_sets: dict = {}    # new_group's, by ranks: made once (Horovod refuses a duplicate set)
        return self.hvd

    def new_group(self, ranks: list[int]):
        """A Horovod process set (where Horovod started with dynamic process sets: `_dynamic`)."""
        if not self.groups:
            raise self.refuse("groups of ranks (Horovod started without dynamic process sets)")
        if sorted(ranks) == list(range(self.hvd.size())):
            return None             # every rank: Horovod's global process set (it refuses a second one)
        if tuple(ranks) not in self.process_sets:     # the auto probe's groups are the exchange's
            self.process_sets[tuple(ranks)] = self.hvd.add_process_set(list(ranks))
        return self.process_sets[tuple(ranks)]

    def drop_groups(self) -> None:
        """Horovod's background loop negotiates every process set each cycle: the unused ones removed (every rank,
        in the order they were made)."""
        for made in self.process_sets.values():
            self.hvd.remove_process_set(made)
        self.process_sets.clear()

    @staticmethod
    def process_set(group) -> dict:
        """The keyword a Horovod collective takes for `group` (none: every rank)."""
        return {} if group is None else {"process_set": group}

    def refresh(self, topology):
        """Horovod elastic renumbers the ranks after workers leave or join: read them again."""
        import dataclasses
        hvd = self.hvd
        return dataclasses.replace(topology, rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                                   local_size=hvd.local_size())

    # Horovod names object collectives after type(obj) unless told: ranks passing objects of
    # different types (rank 0 a payload, the others None) would wait forever. So a name is required.
    def allgather_object(self, obj, name: str) -> list:
        return self.hvd.allgather_object(obj, name=name)

    def broadcast_object(self, obj, name: str, root: int = 0):
        return self.hvd.broadcast_object(obj, root_rank=root, name=name)

    def join(self) -> int:
        """Horovod's join: this rank has no more batches; its allreduces count as zeros until every
        rank has joined. Returns the last rank to join."""
        return self.hvd.join()

    def elastic_run(self, func):
        """`func(state)` under Horovod elastic: the framework's `hvd.elastic.run`."""
        return self.hvd.elastic.run(func)

    def elastic_rank(self) -> int:
        return self.hvd.rank()

    def reduction(self):
        """(compression, op) of this framework's Horovod module for the config."""
        return reduction(self.hvd, self.config)
