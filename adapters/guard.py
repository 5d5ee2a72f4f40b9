"""The NaN/Inf guard of every session's steps (nan_guard; the rule and its one line: toolkit/exchange/numerics.py).

After each optimizer step the facade hands the guard what that step measured: the reduced gradient
norm where it was measured, else the loss averaged over the ranks, else (paths that reduce inside a
framework's own optimizer) this rank's loss; that value must be finite. It is checked one step late,
so reading it back does not stall the device (or MXNet's engine) on the step just queued; `settle`
checks the last one before anything is evaluated, saved or compared. fp16 steps skipped on overflow
are counted (`session.skipped_steps`), not errors.
"""
from __future__ import annotations

from typing import Callable

from toolkit.errors import ToolkitError
from toolkit.exchange import numerics


class NanGuard:
    def __init__(self, session, drain: Callable[[], None]):
        self.session = session
        self.drain = drain              # every rank stops: the step already queued finishes on all of them
        self.unchecked: tuple | None = None     # the last step's (step, value, what), checked one step late

    def after_step(self, loss) -> None:
        s = self.session
        if s.step_skipped:       # fp16 loss scaling: an overflow is skipped on every rank, not an error
            s.skipped_steps += 1
            s.step_skipped = False
            return
        if not s.config.nan_guard:
            return
        if s.grad_norm is not None:
            item = (s.global_step, s.grad_norm, "reduced gradient norm")
        elif s.step_loss is not None:
            item = (s.global_step, s.step_loss, "loss (averaged over the ranks)")
        elif loss is not None:
            item = (s.global_step, loss, "loss")
        else:
            return
        previous, self.unchecked = self.unchecked, item
        if previous is not None:
            self.check(*previous)

    def settle(self) -> None:
        """The last step's check, before its weights are evaluated, saved or compared."""
        if self.unchecked is not None:
            item, self.unchecked = self.unchecked, None
            self.check(*item)

    def check(self, step: int, value, what: str) -> None:
        try:
            numerics.check(step, self.session.to_float(value), what)
        except ToolkitError:
            self.drain()
            raise
