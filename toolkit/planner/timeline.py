"""When a step's gradients are ready during the backward pass and when their reductions end, for the cost
model (toolkit/planner/scaling.py): Horovod's cycles and fusion buffers, DDP's buckets, and the toolkit's
overlapped exchange's buckets, each on one timeline from the backward pass's start.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

# torch's DDP bucket limits: the first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES), then every other
# (bucket_cap_mb's default, 25 MiB), as torch/nn/parallel/distributed.py passes them to its Reducer
DDP_BUCKET_LIMITS = (1024 * 1024, 25 * 1024 * 1024)


def ready_times(tensor_bytes: list[float], backward_s: float, ready_fractions=None) -> list[float]:
    """When each gradient is ready, in seconds from the backward pass's start. `tensor_bytes`: each
    gradient's bytes, in the order the backward pass produces them, each ready at its
    `ready_fractions` of the pass (what share of the backward compute is done by then), or, without
    them, when the pass has done its share in proportion to bytes."""
    if ready_fractions:
        return [backward_s * f for f in ready_fractions]
    total, ready, acc = sum(tensor_bytes), [], 0.0
    for b in tensor_bytes:
        acc += b
        ready.append(backward_s * acc / total if total else backward_s)
    return ready


def horovod_comm_end(tensor_bytes: list[float], backward_s: float, reduce_cost, fusion_bytes: float,
                     cycle_s: float, ready_fractions: Sequence[float] | None = None) -> float:
    """When the last gradient has been reduced, in seconds from the backward pass's start.

    `tensor_bytes`: each gradient's bytes on the wire, ready as `ready_times` says. Horovod's loop starts a
    cycle at least `cycle_s` after the last one began and after its work ended (its phase against the
    step is arbitrary: the first tick half a cycle into the pass, the mean), fuses the gradients
    ready by then into buffers of up to `fusion_bytes` (one that is larger goes alone; 0: no fusion)
    and reduces the buffers one after another, `reduce_cost(bytes)` each."""
    if not tensor_bytes or sum(tensor_bytes) == 0:
        return 0.0
    ready = ready_times(tensor_bytes, backward_s, ready_fractions)
    start, end, i = -cycle_s / 2, 0.0, 0
    while i < len(tensor_bytes):
        start = max(start + cycle_s, end)
        if ready[i] > start:        # nothing ready: sleep whole cycles until something is
            start += cycle_s * math.ceil((ready[i] - start) / cycle_s) if cycle_s > 0 else ready[i] - start
        end = start
        buffer = 0.0
        while i < len(tensor_bytes) and ready[i] <= start:
            if buffer and buffer + tensor_bytes[i] > fusion_bytes:
                end += reduce_cost(buffer)
                buffer = 0.0
            buffer += tensor_bytes[i]
            i += 1
        end += reduce_cost(buffer)
    return end


def ddp_buckets(tensor_bytes: list[float], limits=DDP_BUCKET_LIMITS) -> list[range]:
    """DDP's buckets, as torch's Reducer rebuilds them after the first step (compute_bucket_assignment_by_size
    on the gradients in the order they became ready): each gradient joins the open bucket, which closes
    once it holds its limit or more (so a bucket can end above its limit); the first bucket's limit is
    `limits[0]`, the next one's the next, the last limit holds for all the rest. Each bucket is the
    range of the gradients' indices it holds."""
    out, start, size, k = [], 0, 0.0, 0
    for i, b in enumerate(tensor_bytes):
        size += b
        if size >= limits[k]:
            out.append(range(start, i + 1))
            start, size, k = i + 1, 0.0, min(k + 1, len(limits) - 1)
    return out + ([range(start, len(tensor_bytes))] if start < len(tensor_bytes) else [])


def ddp_comm_end(bucket_bytes: list[float], bucket_ready: list[float], reduce_cost) -> float:
    """When DDP's last bucket has been reduced, in seconds from the backward pass's start: bucket i's
    allreduce (`reduce_cost(bytes)`) is launched once its last gradient is ready (`bucket_ready`) and
    bucket i-1's was launched (its Reducer launches them in order), and the one communication
    stream runs them one after another."""
    end = 0.0
    for size, ready in zip(bucket_bytes, bucket_ready):
        end = max(end, ready) + reduce_cost(size)
    return end


def exchange_buckets(tensor_bytes: list[float], bucket_bytes: float) -> list[tuple[float, int]]:
    """The overlapped exchange's buckets (toolkit/exchange/buckets.py: the flat gradient cut every `bucket_bytes`
    in the order the backward pass readies it, through tensors): (bytes, index of the gradient whose readiness
    completes it) each."""
    total, out, done, acc = sum(tensor_bytes), [], 0.0, 0.0
    for i, b in enumerate(tensor_bytes):
        acc += b
        while acc - done >= bucket_bytes or (i == len(tensor_bytes) - 1 and acc > done):
            size = min(bucket_bytes, total - done)
            out.append((size, i))
            done += size
    return out
