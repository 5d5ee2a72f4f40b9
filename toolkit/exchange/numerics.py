"""Gradient clipping and the NaN/Inf guard, decided here once for every framework.

Both look at the *reduced* gradient: what the optimizer is about to apply, after Horovod's
allreduce (or the toolkit's exchange) and over the whole accumulated step. Every rank holds the
same reduced gradient, so every rank computes the same norm and stops at the same step: no extra
collective. Each session computes the norm on its device (torch `get_total_norm`,
`tf.linalg.global_norm`, an MXNet NDArray sum) and clips there; the toolkit's exchange, whose
gradients are numpy arrays, uses `clip` below. Where a path has no reduced gradient in hand
(tf-keras's and the native strategies' optimizers reduce inside `apply_gradients`; Adasum combines
updates), the guard reads the step's loss instead, and clipping is refused (toolkit/config/rules.py).
"""
from __future__ import annotations

import math

from toolkit.errors import ToolkitError


def clip_factor(norm: float, max_norm: float | None) -> float | None:
    """What gradients of global norm `norm` are multiplied by to clip them to `max_norm` (torch's
    clip_grad_norm_ rule: max_norm / (norm + 1e-6)); None when nothing is to be done."""
    if max_norm is None or not math.isfinite(norm):
        return None
    factor = max_norm / (norm + 1e-6)
    return factor if factor < 1 else None


def clip(grads: list, max_norm: float | None, ops) -> tuple[list, float]:
    """Gradients (in the namespace `ops` of toolkit/exchange/arrays.py) scaled so their global
    L2 norm is at most `max_norm`; (grads, norm before: a host float, or a device scalar on torch's namespace, read
    by the NaN guard with the other pending values)."""
    return ops.clip_by_norm(grads, max_norm)


def check(step: int, value: float, what: str, within: int = 1) -> None:
    """A non-finite step is one line naming the step and the fixes; every rank raises it at the same step
    (`within` steps of it at most: the guard reads every nan_check_every steps)."""
    if math.isfinite(value):
        return
    when = "within one step" if within <= 1 else f"within {within} steps (nan_check_every)"
    raise ToolkitError(f"step {step}: the {what} is {value} (not finite); every rank stopped {when} "
                       "of it and no checkpoint was written from it. "
                       "Lower the learning rate (--lr), clip gradients (--clip-grad-norm 1.0), check the data for "
                       "NaN/Inf, or turn the check off with --no-nan-guard")
