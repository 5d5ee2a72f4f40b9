"""Precision for torch (the interface: adapters/precision.py): the forward pass's
context (torch.autocast in bf16 or fp16), the scaled backward, unscale, the step that fp16 skips on
overflow, and its state in checkpoints (GradScaler's loss scale, for an exact resume).

fp32 and bf16 need no loss scale: their backward is the plain one and every step is applied.
"""
from __future__ import annotations

import contextlib

import torch

from toolkit.adapters.precision import Precision as Base

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision(Base):
    def __init__(self, name: str, device: torch.device):
        self.name, self.device = name, device
        self.dtype = DTYPES.get(name)
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    def forward_context(self):
        """The forward pass in this precision (torch.autocast; fp32: nothing)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss) -> None:
        """fp16: the loss times the loss scale, so small fp16 gradients do not flush to zero."""
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    @property
    def scales(self) -> bool:
        """Whether the gradients are of a scaled loss (unscale before measuring; a step may be skipped)."""
        return self.scaler is not None

    def unscale(self, optimizer) -> None:
        """The reduced gradients divided by the loss scale (before they are measured and clipped)."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer, batch=None) -> bool:
        """The optimizer's step, or (fp16, a gradient not finite) none, the same on every rank since the
        gradients are reduced; the loss scale lowered then. Returns whether the step was skipped."""
        if not self.scaler:
            optimizer.step()
            return False
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() < scale

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
