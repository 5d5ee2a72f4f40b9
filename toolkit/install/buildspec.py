"""What `toolkit build-horovod` is asked to build: the frameworks, CPU or NCCL operations, the
controllers, extra build variables and CUDA architectures; checked when made, each bad flag in one line.
Stdlib only (toolkit/install/horovod.py builds it; workarounds.py decides from it which rows apply).
"""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.errors import ToolkitError
from toolkit.install import pins

ALL_FRAMEWORKS = tuple(pins.HOROVOD_FRAMEWORKS)


@dataclass(frozen=True)
class BuildSpec:
    frameworks: tuple[str, ...] = ALL_FRAMEWORKS
    gpu: bool = False          # HOROVOD_GPU_OPERATIONS=NCCL
    mpi: bool = True           # HOROVOD_WITH_MPI
    gloo: bool = True          # HOROVOD_WITH_GLOO
    extra_env: tuple[str, ...] = ()   # KEY=VALUE passed to the build as they are
    cuda_arch: str | None = None      # "80,90": compute capabilities (default: the GPUs present, else a list)

    @property
    def operations(self) -> str:
        return "nccl" if self.gpu else "cpu"

    @property
    def controllers(self) -> list[str]:
        return [c for c, on in (("mpi", self.mpi), ("gloo", self.gloo)) if on]

    def __post_init__(self):
        unknown = sorted(set(self.frameworks) - set(ALL_FRAMEWORKS))
        if unknown:
            raise ToolkitError(f"--frameworks: unknown {', '.join(unknown)}; "
                               f"choose from {', '.join(ALL_FRAMEWORKS)}")
        if not self.frameworks:
            raise ToolkitError("--frameworks: name at least one of " + ", ".join(ALL_FRAMEWORKS))
        if not (self.mpi or self.gloo):
            raise ToolkitError("build-horovod: --no-mpi and --no-gloo together leave no controller; keep one")
        for item in self.extra_env:
            if "=" not in item:
                raise ToolkitError(f"--env {item!r}: expected KEY=VALUE, e.g. --env HOROVOD_DEBUG=1")
        if self.cuda_arch is not None:
            if not self.gpu:
                raise ToolkitError("--cuda-arch applies to GPU builds; add --gpus or drop it")
            if not all(a.isdigit() and len(a) >= 2 for a in self.cuda_arch.split(",")):
                raise ToolkitError(f"--cuda-arch {self.cuda_arch!r}: expected compute capabilities without the dot, "
                                   "e.g. --cuda-arch 80,90 (A100, H100)")
