"""Precision: one object per session, one interface in every framework (Lightning Fabric's precision
plugin shape), chosen once when the session starts: adapters/<framework>/precision.py.

    forward_context()   the forward pass in this precision (torch.autocast; Keras and MXNet cast inside
                        their layers, from a global policy or AMP set at start: nothing here)
    backward(loss, ...) the scaled backward (fp16: the loss times the loss scale, so small gradients do
                        not flush to zero); torch and MXNet fill the parameters' gradients, TensorFlow
                        returns the tape's
    unscale(target)     the reduced gradients divided by the loss scale, before they are measured and
                        clipped (torch: the optimizer's, in place; TensorFlow: graph values in, (values,
                        all finite) out)
    step(...)           apply the update, or (fp16, a gradient not finite) skip it and lower the scale:
                        the same on every rank, since the gradients are reduced (torch and MXNet:
                        `step(optimizer, batch)` returns whether it skipped; TensorFlow: `step(update,
                        finite)` inside the step's graph)
    state_dict() / load_state_dict(state)   the loss scale, saved with every checkpoint (exact resume)

The facade (adapters/base.py `_reduce_and_apply`) and TensorFlow's step graph call them in the one order
of a step: backward (scaled) -> reduce (strategy) -> unscale -> clip -> finite check, apply or skip.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable


class Precision:
    name: str = "fp32"
    # each framework's own arguments (above): eager frameworks act on the optimizer, TensorFlow in its graph
    backward: Callable[..., Any]
    unscale: Callable[..., Any]
    step: Callable[..., Any]

    @property
    def scales(self) -> bool:
        """Whether the gradients are of a scaled loss (unscale before measuring; a step may be skipped)."""
        return False

    def forward_context(self):
        return contextlib.nullcontext()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None
