"""The one protocol every framework adapter implements, with the same method names everywhere.

The framework-neutral training loop (`toolkit.trainer`) drives an adapter through these methods
only; toolkit algorithms use the tensor operations at the bottom, on numpy arrays.
"""
from __future__ import annotations

import abc
import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from toolkit.errors import ToolkitError
from toolkit.launch import tuning_env


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: str          # "cpu" or "cuda:0", "gpu(1)", ... as the framework names it
    replicas: int = 1    # model replicas this process drives (several only under TF's native strategies)

    @property
    def world_size(self) -> int:
        """Data-parallel replicas in the job: what batch sizes, sharding and lr scaling count."""
        return self.size * self.replicas


def import_horovod(module: str, framework: str):
    """`import horovod.<fw>`, turning a missing or partial Horovod build into a one-line fix."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        if "has not been built" in text or "mpi_lib" in text:
            raise ToolkitError(f"Horovod was built without {framework} support ({text}); rebuild it "
                               f"with `toolkit build-horovod --frameworks {framework}` (or `make setup`)") from None
        if getattr(e, "name", None) == "horovod":
            raise ToolkitError("Horovod is not installed in this Python; run `make setup` "
                               "(or `toolkit build-horovod`)") from None
        raise ToolkitError(f"cannot import {module}: {text}; run `toolkit doctor` for the fix") from None


# Horovod's fusion buffer when training on CPUs and nobody chose one: Horovod's 128 MiB copies every
# gradient into the buffer and back; on CPU cores that copying costs more than the one fused
# operation saves once tensors are a few MiB (docs/BENCHMARKS.md, "fusion": torch, 10.5M-parameter
# MLP, 2 ranks: 128 -> 4 MiB was ~1.4x the throughput over Gloo and 1.0-1.1x over MPI).
CPU_FUSION_THRESHOLD_MB = 4


def apply_horovod_tuning(config, default_fusion_mb: float | None = None) -> None:
    """Fusion threshold, cycle time, timeline and stall check from the config, set before
    `hvd.init()` reads them (Horovod's own environment variables, written by the same
    `toolkit.launch.tuning_env` as `toolkit launch`'s flags, so both agree).
    `default_fusion_mb` applies only when neither the config nor the environment sets a threshold."""
    fusion_mb = config.fusion_threshold_mb
    if fusion_mb is None and "HOROVOD_FUSION_THRESHOLD" not in os.environ:
        fusion_mb = default_fusion_mb
    if config.timeline_file:        # Horovod does not create the timeline's folder
        Path(config.timeline_file).resolve().parent.mkdir(parents=True, exist_ok=True)
    os.environ.update(item.split("=", 1) for item in
                      tuning_env(fusion_mb, config.cycle_time_ms, timeline=config.timeline_file))
    if config.stall_check_seconds == 0:
        os.environ["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    elif config.stall_check_seconds is not None:
        os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(int(config.stall_check_seconds))


def launcher_local_size() -> int:
    """Ranks on this host, from the launcher's environment (for settings made before hvd.init)."""
    for name in ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def threads_per_rank(local_size: int | None = None) -> int:
    """This host's cores shared between its ranks (known before hvd.init, as MXNet and TF need)."""
    return max(1, (os.cpu_count() or 1) // (local_size or launcher_local_size()))


def start_horovod(config, module: str, framework: str, default_fusion_mb: float | None = None, comm=None):
    """Tuning from the config, `import horovod.<fw>`, hvd.init(), the op checked: every adapter's start.
    `comm`: an mpi4py communicator Horovod runs on instead of every rank (e.g. the parameter-server
    job's workers, toolkit/ps.py, or a program that already uses MPI)."""
    apply_horovod_tuning(config, default_fusion_mb)
    hvd = import_horovod(module, framework)
    hvd.init(comm=comm) if comm is not None else hvd.init()
    check_op(hvd, config)
    return hvd


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
        raise ToolkitError("TOOLKIT_REQUIRE_GPU=1 but the framework sees no GPU; unset it to run on CPU")


class Adapter(abc.ABC):
    name: str
    path: str = ""       # how this adapter trains, in a few words (the JSON summary's "path")

    # -- lifecycle, called in this order by toolkit.trainer ------------------------------------
    @abc.abstractmethod
    def init(self, config, comm=None) -> Topology:
        """hvd.init (on the mpi4py communicator `comm` when given), threads and device per local rank."""

    @abc.abstractmethod
    def build(self, config, num_features: int, num_classes: int) -> None:
        """Model and optimizer, initial weights seeded with config.seed + rank (different on purpose)."""

    @abc.abstractmethod
    def wrap(self, config) -> None:
        """Distributed optimizer with the configured compression, accumulation and op."""

    @abc.abstractmethod
    def broadcast(self, root: int = 0) -> None:
        """Model and optimizer state from rank `root` to every rank."""

    @abc.abstractmethod
    def set_lr(self, lr: float) -> None: ...

    @abc.abstractmethod
    def train_step(self, batches: Sequence[tuple[Any, Any]]) -> float:
        """One optimizer step over `accumulation_steps` micro-batches of numpy (x, y); local mean loss.

        With several replicas per process, each micro-batch holds the replicas' batches one after
        the other (replica order), to be split evenly."""

    @abc.abstractmethod
    def evaluate(self, x, y) -> tuple[float, int, int]:
        """(sum of losses, correct, count) on this rank's numpy arrays."""

    @abc.abstractmethod
    def save(self, folder: Path) -> None:
        """Write model + optimizer state into `folder` (the checkpoint module makes it atomic)."""

    @abc.abstractmethod
    def load(self, folder: Path) -> None: ...

    def join(self) -> int:
        """Horovod's join: this rank has no more batches; its allreduces count as zeros until
        every rank has joined. Returns the last rank to join."""
        raise NotImplementedError(f"{type(self).__name__} has no join (see toolkit/registry.py)")

    # -- elastic training (toolkit/elastic.py), for the adapters the registry marks elastic -------
    def snapshot(self):
        """An in-memory copy of model and optimizer state (what an elastic commit keeps)."""
        raise NotImplementedError(f"{type(self).__name__} has no elastic training (see toolkit/registry.py)")

    def restore(self, snapshot) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no elastic training (see toolkit/registry.py)")

    def elastic_run(self, func):
        """`func(state)` under Horovod elastic: the framework's `hvd.elastic.run`."""
        return self.hvd.elastic.run(func)

    def on_reset(self, config) -> None:
        """After Horovod re-formed the job with other workers (hvd.shutdown + hvd.init)."""

    @abc.abstractmethod
    def parameters(self) -> list:
        """Model state as numpy arrays, in a fixed order (for digests and comparisons)."""

    def replica_parameters(self) -> list[list]:
        """`parameters()` of each replica this process drives (one, except under native strategies)."""
        return [self.parameters()]

    # -- the toolkit's exchange (toolkit/communication.py): compression bf16/int8/topk, local SGD --
    # Implemented by the adapters whose registry entry lists those (toolkit/registry.py); `wrap`
    # then leaves the optimizer local (no Horovod distributed optimizer).
    def local_gradients(self, batches: Sequence[tuple[Any, Any]]) -> tuple[float, list]:
        """This rank's gradients over the micro-batches (their mean), as numpy arrays in a fixed
        order, and the local mean loss. No communication."""
        raise NotImplementedError(f"{type(self).__name__} has no toolkit exchange (see toolkit/registry.py)")

    def apply_gradients(self, grads: list) -> None:
        """One optimizer step with these numpy gradients (order as `local_gradients`)."""
        raise NotImplementedError(f"{type(self).__name__} has no toolkit exchange (see toolkit/registry.py)")

    def get_state(self) -> list:
        """What local SGD averages: the trainable parameters and the optimizer's slots, as numpy arrays."""
        raise NotImplementedError(f"{type(self).__name__} has no toolkit exchange (see toolkit/registry.py)")

    def set_state(self, arrays: list) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no toolkit exchange (see toolkit/registry.py)")

    def weights(self) -> list:
        """The trainable parameters as numpy arrays, in `local_gradients` order (parameter server)."""
        raise NotImplementedError(f"{type(self).__name__} has no toolkit exchange (see toolkit/registry.py)")

    def set_weights(self, arrays) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no toolkit exchange (see toolkit/registry.py)")

    def allgather(self, array):
        """1-D numpy array in (any length per rank), the ranks' arrays concatenated in rank order out."""
        raise NotImplementedError(f"{type(self).__name__} has no toolkit exchange (see toolkit/registry.py)")

    # -- tensor operations for toolkit algorithms -------------------------------------------------
    @abc.abstractmethod
    def allreduce(self, array, average: bool = True, name: str | None = None):
        """numpy array in, numpy array out, summed or averaged over ranks. Horovod names an unnamed
        collective by a per-process counter, so ranks that ran different numbers of operations
        (uneven data, joined ranks) must name theirs."""

    # Object collectives, the same for every framework's Horovod module (set as self.hvd in init).
    # Horovod names them after type(obj) unless told: ranks passing objects of different types
    # (rank 0 a payload, the others None) would wait forever. So a name is required.
    def allgather_object(self, obj, name: str) -> list:
        return self.hvd.allgather_object(obj, name=name)

    def broadcast_object(self, obj, name: str, root: int = 0):
        return self.hvd.broadcast_object(obj, root_rank=root, name=name)
