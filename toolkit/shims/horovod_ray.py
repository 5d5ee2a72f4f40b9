"""Horovod 0.28.1's Ray integration (horovod.ray), mended at run time for Ray 2.60.

Each mend names what it fixes; `apply()` is idempotent and imports Ray and horovod.ray.

1. `BaseHorovodWorker.node_id` reads `ray.get_runtime_context().node_id`, deprecated: every worker
   printed `RayDeprecationWarning: This API is deprecated ... Use get_node_id() instead` (three lines
   a worker) and it goes in a future Ray. It now calls `get_node_id()`, which returns the same hex id.
"""
from __future__ import annotations

RESET_LIMIT = 3         # elastic: resets before the job fails for good
COOLDOWN = (1, 5)       # elastic: seconds a host that failed waits before it may take workers again

_applied = False


def apply() -> None:
    global _applied
    if _applied:
        return
    import ray
    from horovod.ray import worker

    worker.BaseHorovodWorker.node_id = lambda self: ray.get_runtime_context().get_node_id()
    _applied = True
