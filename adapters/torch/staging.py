"""checkpoint_async's copy of the state into host memory, made into the buffers the save before was written from.

A save in the background first copies every tensor of the state into host memory (training goes on and changes the
originals), then a thread writes the copy. The copy is kept after its write, and the next save copies into it. A
new allocation costs the copy and the steps during the write several times more (benchmarks/checkpoint_bench.py,
256 MB of weights and SGD momentum, one training thread on 2 cores, runs of each version alternating: save() took
90-92 ms with new host memory, 16-21 ms into the save before's; the steps lost during the write, the call included,
135-194 ms against 22-43 ms). One save is in flight at a time (adapters/checkpointer.py waits for the one before,
then copies), so the buffers are free when they are reused. The host memory stays taken between saves: one copy of
the state, what a save takes anyway.

A sharded save goes through DCP's `async_save`, which stages into host memory itself: one stager kept for the
process (`dcp_stager`) keeps each tensor's host copy from one save to the next in the same way.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch


def host_copy(value, staged=None):
    """`value` with its containers rebuilt and its tensors copied to the CPU: into `staged`'s tensor at the same
    place where that has the same shape and dtype (the copy the save before made, written by now), else into a
    new one; anything else copied as it is."""
    if torch.is_tensor(value):
        value = value.detach()
        if (type(staged) is torch.Tensor and type(value) is torch.Tensor and value.layout is torch.strided
                and staged.shape == value.shape and staged.dtype == value.dtype):
            return staged.copy_(value)
        return value.to("cpu", copy=True)
    if isinstance(value, Mapping):
        before = staged if isinstance(staged, Mapping) else {}
        out = type(value)((k, host_copy(v, before.get(k))) for k, v in value.items())
        if hasattr(value, "_metadata"):      # a module's state_dict: the layers' versions, as torch.save keeps them
            out._metadata = copy.deepcopy(value._metadata)
        return out
    if isinstance(value, (list, tuple)):
        before = staged if isinstance(staged, (list, tuple)) and len(staged) == len(value) else [None] * len(value)
        return type(value)(host_copy(v, b) for v, b in zip(value, before))
    return copy.deepcopy(value)


_STAGER: Any = None


def dcp_stager():
    """The process's stager for DCP's `async_save`: its host copies kept from one save to the next (DCP's
    default makes a new one, and new host memory, every save)."""
    global _STAGER
    if _STAGER is None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        _STAGER = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                               use_async_staging=False, use_non_blocking_copy=False))
    return _STAGER
