"""Horovod's tuning flags as the HOROVOD_* variables every rank reads: `toolkit launch`'s --fusion-threshold-mb,
--cycle-time-ms, --autotune and --timeline-file, and the same config keys in a rank (adapters/horovod.py), so
both agree. Below the launch package and the adapters, which both import it."""
from __future__ import annotations

import os
from typing import Optional

from toolkit.errors import ToolkitError


def tuning_env(fusion_threshold_mb: Optional[float] = None, cycle_time_ms: Optional[float] = None,
               autotune: bool = False, timeline: Optional[str] = None) -> tuple[str, ...]:
    """Horovod's tuning as the variables every rank reads (works under horovodrun and mpirun alike;
    the same config keys in a rank's own config override them)."""
    env = []
    if fusion_threshold_mb is not None:
        if fusion_threshold_mb < 0:
            raise ToolkitError(f"--fusion-threshold-mb {fusion_threshold_mb:g}: must be 0 (fusion off) or more")
        env.append(f"HOROVOD_FUSION_THRESHOLD={int(fusion_threshold_mb * 1024 * 1024)}")
    if cycle_time_ms is not None:
        if cycle_time_ms <= 0:
            raise ToolkitError(f"--cycle-time-ms {cycle_time_ms:g}: must be more than 0")
        env.append(f"HOROVOD_CYCLE_TIME={cycle_time_ms:g}")
    if autotune:
        env.append("HOROVOD_AUTOTUNE=1")
    if timeline:
        env.append(f"HOROVOD_TIMELINE={os.path.abspath(timeline)}")
    return tuple(env)
