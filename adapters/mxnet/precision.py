"""Precision for MXNet, one object (the same shape as torch's, adapters/torch/precision.py).

bf16 is MXNet's AMP (mxnet.contrib.amp): it casts the inputs of its bf16 operators (convolutions,
dense layers) to bfloat16 in every model built after the session starts; parameters, their
gradients (what is reduced) and BatchNorm stay float32, so nothing is scaled, unscaled or skipped.
fp16 is refused for MXNet when the config resolves (toolkit/registry.py).
"""
from __future__ import annotations

import contextlib

import numpy as np


def _amp_bf16() -> None:
    """MXNet's AMP in bfloat16, once per process (before the model is built)."""
    from mxnet.contrib import amp
    if not getattr(amp.amp, "_amp_initialized", False):
        amp.init(target_dtype="bfloat16")


def float32(array):
    """Outputs of a bf16 model (AMP) as float32, for the loss and the accuracy."""
    return array if array.dtype == np.float32 else array.astype("float32")


class Precision:
    scales = False

    def __init__(self, name: str):
        self.name = name
        if name == "bf16":
            _amp_bf16()

    def forward_context(self):
        return contextlib.nullcontext()     # AMP casts inside the operators

    def unscale(self, trainer) -> None:
        pass

    def step(self, trainer, batch: float) -> bool:
        """The Trainer's update of the reduced gradients (divided by `batch`); never skipped."""
        trainer.update(batch)
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
