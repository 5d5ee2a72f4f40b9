"""Derived values: the defaults of keys whose meaning depends on other keys (`topk_ratio` only with compression
topk, `staleness` only with sync ssp, ...). `complete` returns a new Config with them filled in; `Config(...)` calls
it, so every Config a caller holds is complete. The values themselves are the fields' `unset` metadata (groups.py).
"""
from __future__ import annotations

import dataclasses

from .enums import PS_SYNCS, TOOLKIT_COMPRESSIONS, Compression, LrSchedule, Sync
from .groups import unset_default


def missing(c) -> dict:
    """{key: value} for each unset key that applies to validated Config `c` and has a default."""
    applies = {
        "topk_ratio": c.compression is Compression.TOPK,
        "powersgd_rank": c.compression is Compression.POWERSGD,
        "dgc_warmup_epochs": c.dgc,
        "error_feedback": c.compression in TOOLKIT_COMPRESSIONS,
        "local_steps": c.sync is Sync.LOCAL_SGD,
        "staleness": c.sync is Sync.SSP,
        "ps_servers": c.sync in PS_SYNCS,
        "elastic_commit_every": c.elastic,
        "lr_step_epochs": c.lr_schedule is LrSchedule.STEP,
        "lr_step_gamma": c.lr_schedule is LrSchedule.STEP,
    }
    return {name: unset_default(name) for name, applies in applies.items() if applies and getattr(c, name) is None}


def complete(c):
    """`c`, or a new Config (dataclasses.replace) with the derived values filled in."""
    values = missing(c)
    return dataclasses.replace(c, **values) if values else c
