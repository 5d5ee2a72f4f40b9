"""Horovod 0.28.1's Ray integration (horovod.ray), mended at run time for Ray 2.60.

Each mend names what it fixes; `apply()` is idempotent and imports Ray and horovod.ray.

1. `BaseHorovodWorker.node_id` reads `ray.get_runtime_context().node_id`, deprecated: every worker
   printed `RayDeprecationWarning: This API is deprecated ... Use get_node_id() instead` (three lines
   a worker) and it goes in a future Ray. It now calls `get_node_id()`, which returns the same hex id.
2. The elastic executor (`RayExecutor(min_workers=...)`) waits for two hosts before it starts unless it
   is given the network interfaces (`_get_min_start_hosts`: its interface detection pings host to host),
   so on a one-node Ray an elastic job hung in `wait_for_available_slots` with no message.
   `elastic_nics()` gives it --network-interface, or `lo` when the cluster has one node.

Not mended (the tests and docs/CLUSTERS.md work around them): Horovod names a Ray node by its IP
(`NodeManagerAddress`), so two raylets on one address are one host to it (test nodes use 127.0.0.1 and
127.0.0.2); a host whose worker failed is blacklisted for `COOLDOWN` seconds, so a one-node elastic job
cannot outlive a failed worker (every slot is on the blacklisted host: "blacklisted slots count == 2 ->
stop running").
"""
from __future__ import annotations

RESET_LIMIT = 3         # elastic: resets before the job fails for good
COOLDOWN = (1, 5)       # elastic: seconds a host that failed waits before it may take workers again

_applied = False


def elastic_nics(network_interface):
    """The interfaces the elastic executor is given: --network-interface, or `lo` on a one-node cluster."""
    import ray

    if network_interface:
        return {network_interface}
    return {"lo"} if len([n for n in ray.nodes() if n["Alive"]]) == 1 else None


def apply() -> None:
    global _applied
    if _applied:
        return
    import ray
    from horovod.ray import worker

    worker.BaseHorovodWorker.node_id = lambda self: ray.get_runtime_context().get_node_id()
    _applied = True
