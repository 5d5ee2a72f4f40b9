"""Precision for MXNet (the interface: adapters/precision.py).

bf16 is MXNet's AMP (mxnet.contrib.amp): it casts the inputs of its bf16 operators (convolutions,
dense layers) to bfloat16 in every model built after the session starts; parameters, their
gradients (what is reduced) and BatchNorm stay float32, so nothing is scaled, unscaled or skipped.
fp16 is refused for MXNet when the config resolves (toolkit/registry.py).
"""
from __future__ import annotations

import numpy as np

from toolkit.adapters.precision import Precision as Base
from toolkit.errors import ToolkitError
from toolkit.install import toolchain


def _amp_bf16() -> None:
    """MXNet's AMP in bfloat16, once per process (before the model is built)."""
    from mxnet.contrib import amp
    if not getattr(amp.amp, "_amp_initialized", False):
        amp.init(target_dtype="bfloat16")


def float32(array):
    """Outputs of a bf16 model (AMP) as float32, for the loss and the accuracy."""
    return array if array.dtype == np.float32 else array.astype("float32")


def check_bf16_cpu(flags: frozenset[str]) -> None:
    """precision bf16 on MXNet's CPU operators (oneDNN's bfloat16 kernels, AVX-512): refused in one line
    where the CPU cannot run them; MXNet's engine would fail at the first bf16 operator ("could not
    create a primitive descriptor iterator", seen on an AVX2-only AMD EPYC)."""
    if not toolchain.cpu_runs_bf16(flags):
        missing = ", ".join(sorted(toolchain.AVX512_CORE - flags))
        raise ToolkitError(f"precision=bf16 with framework=mxnet runs MXNet's bf16 CPU operators (oneDNN), which "
                           f"need AVX-512; this CPU lacks {missing}; use precision: fp32 here, or bf16 with torch "
                           "or tensorflow")


class Precision(Base):
    def __init__(self, name: str, on_cpu: bool = True):
        self.name = name
        if name == "bf16" and on_cpu:
            check_bf16_cpu(toolchain.cpu_flags())
        if name == "bf16":
            _amp_bf16()

    def backward(self, loss) -> None:
        """Nothing is scaled (AMP casts inside the operators; bf16 needs no loss scale)."""
        loss.backward()

    def unscale(self, trainer) -> None:
        """Nothing to divide: no loss scale."""

    def step(self, trainer, batch: float) -> bool:
        """The Trainer's update of the reduced gradients (divided by `batch`); never skipped."""
        trainer.update(batch)
        return False
