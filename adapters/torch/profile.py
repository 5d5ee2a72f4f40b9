"""torch's profiler for a window of steps (toolkit/run/profile.py): CPU activities, CUDA's on a GPU; the trace
as Chrome/Perfetto JSON, the rank in its name."""
from __future__ import annotations

from pathlib import Path

import torch

from toolkit.run.profile import TRACE


def start(session, folder: Path):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()

    def stop() -> None:
        profiler.stop()
        profiler.export_chrome_trace(str(folder / TRACE.format(rank=session.rank)))
    return stop
