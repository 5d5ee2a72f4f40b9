"""Preemption: SIGTERM (what Slurm and Kubernetes send before they stop a job) asks every rank to
finish its step, rank 0 to write a checkpoint, and the job to exit with EXIT_CODE.

The signal may reach one rank only (a node drained, a pod evicted): `session.should_stop()` is a
collective that turns one rank's request into every rank's answer at the same step, as Accelerate's
`set_trigger`/`check_trigger` do. A second SIGTERM is not caught: the process ends at once.
"""
from __future__ import annotations

import signal
import threading

from toolkit.errors import ToolkitError

EXIT_CODE = 75          # sysexits' EX_TEMPFAIL: stopped on request, checkpointed; run again with --resume
SIGNALS = (signal.SIGTERM,)
_received: list[str] = []


def _handler(signum, frame) -> None:
    _received.append(signal.Signals(signum).name)
    signal.signal(signum, signal.SIG_DFL)      # the next one is not caught


def install() -> None:
    """Catch SIGTERM from now on (the main thread only: Python delivers signals there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _handler)


def requested() -> bool:
    """Whether this process was sent SIGTERM (not a collective: see session.should_stop())."""
    return bool(_received)


def request() -> None:
    """Ask for a stop from code, as SIGTERM does (e.g. a time limit your script keeps itself)."""
    _received.append("request")


class Preempted(ToolkitError):
    """The job stopped on SIGTERM after a whole step, with a checkpoint when checkpoint_dir is set."""
    label = "stopped"

    def __init__(self, step: int, checkpoint_dir: str | None):
        what = (f"rank 0 wrote {checkpoint_dir}/ckpt-{step:08d}; continue with --resume" if checkpoint_dir else
                "no checkpoint_dir, nothing saved (set --checkpoint-dir to continue after a preemption)")
        super().__init__(f"SIGTERM: every rank finished step {step}; {what} (exit {EXIT_CODE})", code=EXIT_CODE)
