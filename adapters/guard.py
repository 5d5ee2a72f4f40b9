"""The NaN/Inf guard of every session's steps (nan_guard; the rule and its one line: toolkit/exchange/numerics.py).

After each optimizer step the facade hands the guard what that step measured: the reduced gradient
norm where it was measured, else the loss averaged over the ranks, else (paths that reduce inside a
framework's own optimizer) this rank's loss; that value must be finite. The values stay where the
step left them (a device tensor: no host sync) and are read together every `nan_check_every` steps
(torch: one read for all of them), at the same step on every rank; the first non-finite one stops
training with its step named. `settle` reads what is pending before anything is evaluated, saved or
compared, so no checkpoint holds weights from a non-finite step. fp16 steps skipped on overflow are
counted (`session.skipped_steps`), not errors (GradScaler's own skip reads its flag every step, as in torch).
"""
from __future__ import annotations

from typing import Callable

from toolkit.errors import ToolkitError
from toolkit.exchange import numerics


class NanGuard:
    def __init__(self, session, drain: Callable[[], None]):
        self.session = session
        self.drain = drain              # every rank stops: the step already queued finishes on all of them
        self.unchecked: list[tuple] = []        # (step, value, what) of the steps since the last read

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
        self.unchecked.append(item)
        if s.global_step % s.config.nan_check_every == 0:
            self.settle()
        elif len(self.unchecked) > s.guard_window:      # MXNet: one step late (its engine keeps the values'
            self._read(self.unchecked[:-1])             # named allreduces in flight until they are read)
            self.unchecked = self.unchecked[-1:]

    def settle(self) -> None:
        """The pending steps' values read (one host read), before weights are evaluated, saved or compared."""
        items, self.unchecked = self.unchecked, []
        self._read(items)

    def _read(self, items: list) -> None:
        if not items:
            return
        values = self.session.to_floats([value for _, value, _ in items])
        try:
            for (step, _, what), value in zip(items, values):
                numerics.check(step, value, what, within=self.session.config.nan_check_every)
        except ToolkitError:
            self.drain()
            raise
