"""The rules of the exchange's keys (compression auto, hierarchical_exchange, overlap, DGC and PowerSGD), alone and
with the rest of the config; toolkit/config/rules.py runs them at their place in `validate`'s order."""
from __future__ import annotations

from .checks import ELASTIC, bad
from .enums import Compression, Op, Optimizer, Sync
from .values import ConfigError


def check_auto(c) -> None:
    """compression: auto picks none, fp16, bf16 or int8 (flat or hierarchical) among those the rest of the config
    allows (toolkit/planner/auto.py); what rules out every one of them is said here."""
    if c.compression is not Compression.AUTO:
        return
    if c.sync is not Sync.EVERY_STEP:
        raise ConfigError(f"compression: auto chooses how every step's gradients travel (got sync={c.sync.value!r}); "
                          "use sync every_step, or name the compression", "compression", "sync")
    if c.elastic:
        raise ConfigError("compression: auto probes the links once, at start; an elastic job's ranks change: name the "
                          "compression (none or fp16) or drop the elastic keys", "compression", *ELASTIC)
    if c.op is Op.ADASUM:
        raise ConfigError("compression: auto chooses among averaging methods; op adasum is Horovod's own reduce: use "
                          "op average or sum, or compression none", "compression", "op")


def check_hierarchical(c) -> None:
    if not c.hierarchical_exchange:
        return
    if c.compression not in (Compression.NONE, Compression.BF16, Compression.INT8, Compression.AUTO) or c.dgc:
        raise ConfigError(f"hierarchical_exchange: true runs compression none, bf16 or int8 (got compression="
                          f"{c.compression.value!r}{', dgc' if c.dgc else ''}); use one of those or drop hierarchical_exchange",
                          "hierarchical_exchange", "compression")
    if c.sync is not Sync.EVERY_STEP:
        raise ConfigError(f"hierarchical_exchange: true exchanges every step's gradients (got sync={c.sync.value!r}); "
                          "use sync every_step or drop hierarchical_exchange", "hierarchical_exchange", "sync")
    if c.elastic:
        raise ConfigError("hierarchical_exchange: true keeps its groups of ranks for the whole job; an elastic job's ranks "
                          "change: drop hierarchical_exchange or the elastic keys", "hierarchical_exchange", *ELASTIC)
    if c.op is Op.ADASUM:
        raise ConfigError("hierarchical_exchange: true averages or sums; op adasum is Horovod's own reduce: use op average "
                          "or sum, or drop hierarchical_exchange", "hierarchical_exchange", "op")


def check_overlap(c) -> None:
    if not c.bucket_mb > 0:
        bad("bucket_mb", c.bucket_mb, "must be a positive number of megabytes", example="25")
    if not c.overlap:
        return
    if c.framework != "torch":
        raise ConfigError(f"overlap: true is torch's (its gradient hooks start each bucket's exchange); on "
                          f"{c.framework} the exchange runs after the backward pass: drop overlap", "overlap", "framework")
    if not c.overlap_capable and c.compression is not Compression.AUTO:      # auto: its candidates that overlap
        raise ConfigError(f"overlap: true runs the toolkit's exchange of compression bf16 or int8 (or the hierarchical "
                          f"exchange) every step (got compression={c.compression.value!r}{', dgc' if c.dgc else ''}, "
                          f"sync={c.sync.value!r}); use those or drop overlap", "overlap", "compression", "sync")


def check_dgc_powersgd(c) -> None:
    if c.powersgd_rank is not None:
        if c.compression is not Compression.POWERSGD:
            raise ConfigError(f"powersgd_rank applies to compression: powersgd (got compression="
                              f"{c.compression.value!r}); add --compression powersgd or drop powersgd_rank",
                              "powersgd_rank", "compression")
        if c.powersgd_rank < 1:
            bad("powersgd_rank", c.powersgd_rank, "must be a positive integer", example="2")
    if not c.dgc_masking and not c.dgc:
        raise ConfigError("dgc_masking applies with dgc: true; add --dgc or drop dgc_masking", "dgc_masking", "dgc")
    if c.powersgd_warmup_steps and c.compression is not Compression.POWERSGD:
        raise ConfigError("powersgd_warmup_steps applies to compression: powersgd; add --compression powersgd "
                          "or drop powersgd_warmup_steps", "powersgd_warmup_steps", "compression")
    if c.powersgd_warmup_steps < 0:
        bad("powersgd_warmup_steps", c.powersgd_warmup_steps, "must be >= 0", example="1000")
    if c.dgc_warmup_epochs is not None and not c.dgc:
        raise ConfigError("dgc_warmup_epochs applies with dgc: true; add --dgc or drop dgc_warmup_epochs",
                          "dgc_warmup_epochs", "dgc")
    if c.dgc_warmup_epochs is not None and c.dgc_warmup_epochs < 0:
        bad("dgc_warmup_epochs", c.dgc_warmup_epochs, "must be >= 0", example="4")
    if not c.dgc:
        return
    if c.compression is not Compression.TOPK:
        raise ConfigError(f"dgc applies to compression: topk (got compression={c.compression.value!r}); "
                          "add --compression topk or drop dgc", "dgc", "compression")
    if c.optimizer is not Optimizer.SGD:
        raise ConfigError(f"dgc corrects SGD's momentum (got optimizer={c.optimizer.value!r}); "
                          "use optimizer: sgd or drop dgc", "dgc", "optimizer")
    if c.error_feedback is False:
        raise ConfigError("dgc accumulates what was not sent (its error feedback); drop error_feedback: false",
                          "dgc", "error_feedback")
    if c.sync is not Sync.EVERY_STEP:
        raise ConfigError(f"dgc runs with sync: every_step (got sync={c.sync.value!r}); drop dgc or the sync",
                          "dgc", "sync")
