"""What one rank sends over the links for a collective, under the algorithm the planner assumes for it.

`bytes_sent_per_step` counts the payload a rank hands to collectives; `wire_bytes_per_step` what
crosses the links for it, per collective kind (`nbytes`: what this rank handed over):

- allreduce (ring): 2(N-1)/N of the buffer: a reduce-scatter and an allgather of N chunks.
- allgather (ring): N-1 payloads: every other rank's payload passes through this rank once (taken as
  N-1 copies of this rank's own, as the ranks' payloads are the same size or close to it).
- alltoall (pairwise): (N-1)/N of the buffer: every part but the one a rank keeps for itself.
- reducescatter (ring, FSDP's gradients): (N-1)/N of the buffer.

The planner's cost model (toolkit/planner/scaling.py) uses the same terms.
"""
from __future__ import annotations

KINDS = ("allreduce", "allgather", "alltoall", "reducescatter")


def messages(kind: str, n: int) -> int:
    """Messages one rank sends in sequence (each pays the link's latency)."""
    if n <= 1:
        return 0
    return {"allreduce": 2 * (n - 1), "allgather": n - 1, "alltoall": n - 1, "reducescatter": n - 1}[kind]


def sent(kind: str, nbytes: float, n: int) -> float:
    """Bytes one of `n` ranks sends over the links for a collective it handed `nbytes`."""
    if n <= 1:
        return 0.0
    return {"allreduce": 2 * (n - 1) / n * nbytes, "allgather": (n - 1) * nbytes,
            "alltoall": (n - 1) / n * nbytes, "reducescatter": (n - 1) / n * nbytes}[kind]
