"""MXNet's profiler for a window of steps (toolkit/run/profile.py): every operator, the engine's queue drained
before it stops; the trace as Chrome/Perfetto JSON, the rank in its name."""
from __future__ import annotations

from pathlib import Path

import mxnet as mx

from toolkit.run.profile import TRACE


def start(session, folder: Path):
    mx.nd.waitall()
    mx.profiler.set_config(profile_all=True, aggregate_stats=False,
                           filename=str(folder / TRACE.format(rank=session.rank)))
    mx.profiler.set_state("run")

    def stop() -> None:
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        mx.profiler.dump()
    return stop
