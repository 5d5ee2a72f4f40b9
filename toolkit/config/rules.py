"""Validation: every check of one key's range, of keys that only make sense together (across groups), and of
what the chosen framework and backend implement (toolkit/registry.py). `validate` runs them in one fixed order:
the first error a config raises is part of the interface, and each message names the key, its value and the fix.
"""
from __future__ import annotations

import re
from typing import Optional

from toolkit import registry

from . import exchange_rules
from .checks import ELASTIC
from .checks import bad as _bad
from .enums import (
    IMAGE_MODELS,
    ON_DISK,
    PS_SYNCS,
    TOOLKIT_COMPRESSIONS,
    Backend,
    CheckpointFormat,
    Compression,
    Dataset,
    Keras,
    LrSchedule,
    Model,
    Op,
    Precision,
    Sharding,
    Sync,
    TfStrategy,
)
from .groups import _example
from .values import ConfigError


def on_disk(value: str) -> tuple[str, str] | None:
    """`imagefolder:PATH`, `cifar10:PATH`, `text:PATH` -> (kind, PATH); anything else None."""
    kind, sep, path = str(value).partition(":")
    return (kind, path) if sep and kind in ON_DISK else None


def is_reference(value: str) -> bool:
    """`pkg.module:function` or `path/file.py:function`: the user's code, not a built-in name."""
    module, sep, function = str(value).rpartition(":")
    return bool(sep and module and function.isidentifier())


def profile_window(spec: str) -> tuple[int, int]:
    """profile_steps `START:END` -> (START, END), 0 <= START < END; a one-line error otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(spec))
    if not m or int(m.group(1)) >= int(m.group(2)):
        raise ConfigError(f"profile_steps={spec!r}: expected START:END, the optimizer steps to profile counted from 0 "
                          "with START < END (END not profiled), e.g. --profile-steps 2:5", "profile_steps")
    return int(m.group(1)), int(m.group(2))


def rank_values(key: str, spec: Optional[str], valid, error: str) -> dict[int, float]:
    """`RANK:VALUE[,RANK:VALUE]` (the value of `key`) -> {rank: value}; `error` (one line) when a part does not
    parse or `valid(value)` is false."""
    values = {}
    for item in filter(None, (spec or "").replace(" ", "").split(",")):
        rank, _, value = item.partition(":")
        try:
            values[int(rank)] = float(value)
        except ValueError:
            raise ConfigError(error, key) from None
        if int(rank) < 0 or not valid(values[int(rank)]):
            raise ConfigError(error, key)
    return values


def validate(c) -> None:
    """Raise ConfigError (one line, naming the keys it is about) for the first thing wrong with Config `c`, in the
    historical order. Where each key's value came from is added by the merge of the sources (sources.py)."""
    positive_ints = ("epochs", "batch_size", "accumulation_steps", "hidden_size",
                     "hidden_layers", "keep_checkpoints", "heads", "preemption_check_every", "nan_check_every")
    for name, enum_kind, verb in (("model", Model, "build"), ("dataset", Dataset, "load")):
        value = getattr(c, name)
        if name == "dataset" and on_disk(value):
            continue
        if value not in {m.value for m in enum_kind} and not is_reference(value):
            raise ConfigError(f"{name}={value!r}: not one of the built-in {name}s "
                              f"({', '.join(m.value for m in enum_kind)}) nor a reference to your own "
                              f"`pkg.module:{verb}` (a module on PYTHONPATH or a .py file before the colon)", name)
    _check_workload(c)
    if c.loader_workers < 0:
        _bad("loader_workers", c.loader_workers, "must be >= 0", example="2")
    for name in positive_ints:
        if getattr(c, name) < 1:
            _bad(name, getattr(c, name), "must be a positive integer", example=_example(name))
    if not c.lr > 0:
        _bad("lr", c.lr, "must be > 0", example="0.05")
    if not 0 <= c.momentum < 1:
        _bad("momentum", c.momentum, "must be in [0, 1)", example="0.9")
    for name in ("weight_decay", "warmup_epochs"):
        if getattr(c, name) < 0:
            _bad(name, getattr(c, name), "must be >= 0", example="0")
    _check_schedule(c)
    if c.fusion_threshold_mb is not None and c.fusion_threshold_mb < 0:
        _bad("fusion_threshold_mb", c.fusion_threshold_mb, "must be >= 0 (0 turns fusion off), or unset "
             "for Horovod's default", example="64")
    if c.cycle_time_ms is not None and not c.cycle_time_ms > 0:
        _bad("cycle_time_ms", c.cycle_time_ms, "must be > 0, or unset for Horovod's default", example="5")
    _check_communication(c)
    if c.clip_grad_norm is not None and not c.clip_grad_norm > 0:
        _bad("clip_grad_norm", c.clip_grad_norm, "must be > 0 (the largest global gradient norm), or unset "
             "for no clipping", example="1.0")
    if c.stall_check_seconds is not None and c.stall_check_seconds < 0:
        _bad("stall_check_seconds", c.stall_check_seconds, "must be >= 0 (0 turns the check off)",
             example="120")
    if c.backend is Backend.NATIVE:
        for name in ("timeline_file", "stall_check_seconds", "fusion_threshold_mb", "cycle_time_ms"):
            if getattr(c, name) is not None:
                raise ConfigError(f"{name} is a Horovod setting and backend=native does not use Horovod; "
                                  f"drop {name} or use --backend horovod", name, "backend")
    if c.resume and not c.checkpoint_dir:
        raise ConfigError("resume=true needs checkpoint_dir: pass --checkpoint-dir DIR "
                          "(the folder an earlier run wrote checkpoints to)", "resume", "checkpoint_dir")
    _check_checkpoint_format(c)
    _check_elastic(c)
    c.straggler_delays()     # validates the spec
    profile_window(c.profile_steps)
    for name in ("mlflow_experiment", "mlflow_run_name"):
        if getattr(c, name) and not c.mlflow_tracking_uri:
            raise ConfigError(f"{name} names an MLflow run's place, but nothing logs to MLflow: set "
                              "mlflow_tracking_uri (--mlflow-tracking-uri URI), or drop it", name, "mlflow_tracking_uri")
    c.data_fractions()
    _check_capabilities(c)


def _check_checkpoint_format(c) -> None:
    """checkpoint_format sharded: torch's (torch.distributed.checkpoint), every rank's own shards."""
    if c.checkpoint_format is not CheckpointFormat.SHARDED:
        return
    if c.framework != "torch":
        raise ConfigError(f"checkpoint_format='sharded' is torch's (torch.distributed.checkpoint); "
                          f"framework={c.framework!r} keeps the single format (rank 0 writes the whole state, every "
                          f"rank reads it back): drop checkpoint_format or set it to single", "checkpoint_format",
                          "framework")
    if c.sync in PS_SYNCS:
        raise ConfigError(f"checkpoint_format='sharded' with sync={c.sync.value!r}: the parameter servers keep "
                          f"the model and checkpoint it themselves; use checkpoint_format single",
                          "checkpoint_format", "sync")


def _check_schedule(c) -> None:
    """lr_schedule, and the keys of its step schedule (their defaults: derived.py)."""
    if c.lr_schedule is not LrSchedule.STEP:
        for name in ("lr_step_epochs", "lr_step_gamma"):
            if getattr(c, name) is not None:
                raise ConfigError(f"{name} applies to lr_schedule: step (got lr_schedule={c.lr_schedule.value!r}); "
                                  f"add --lr-schedule step or drop {name}", name, "lr_schedule")
        return
    if c.lr_step_epochs is not None and not c.lr_step_epochs > 0:
        _bad("lr_step_epochs", c.lr_step_epochs, "must be > 0 (epochs between two decays)", example="30")
    if c.lr_step_gamma is not None and not 0 < c.lr_step_gamma <= 1:
        _bad("lr_step_gamma", c.lr_step_gamma, "must be in (0, 1] (the factor of each decay)", example="0.1")


def _check_elastic(c) -> None:
    if not c.elastic:
        return
    for name in ("elastic_min_np", "elastic_max_np", "elastic_commit_every"):
        if getattr(c, name) is not None and getattr(c, name) < 1:
            _bad(name, getattr(c, name), "must be a positive integer", example="2")
    if (c.elastic_min_np and c.elastic_max_np) and c.elastic_max_np < c.elastic_min_np:
        raise ConfigError(f"elastic_max_np={c.elastic_max_np} is below elastic_min_np={c.elastic_min_np}; "
                          "raise max_np or lower min_np", "elastic_max_np", "elastic_min_np")
    if c.backend is not Backend.HOROVOD:
        torchrun = (" (torch: torchrun restarts the workers and they resume from the newest checkpoint: "
                    "`toolkit launch --backend native --min-np N`, no resume key needed)" if c.framework == "torch" else "")
        raise ConfigError(f"elastic training is Horovod elastic; with backend=native drop the elastic keys{torchrun}",
                          "backend", *ELASTIC)
    if c.toolkit_exchange:
        raise ConfigError(f"elastic training runs Horovod's distributed optimizer; compression="
                          f"{c.compression.value!r} / sync={c.sync.value!r} are the toolkit's exchange, "
                          "which keeps per-rank state: use compression none or fp16 and sync every_step",
                          "compression", "sync", *ELASTIC)


def _check_communication(c) -> None:
    """The communication keys, alone and together (their defaults that depend on other keys: derived.py)."""
    toolkit_compression = c.compression in TOOLKIT_COMPRESSIONS
    exchange_rules.check_auto(c)
    if c.topk_ratio is not None:
        if c.compression is not Compression.TOPK:
            raise ConfigError(f"topk_ratio applies to compression: topk (got compression="
                              f"{c.compression.value!r}); add --compression topk or drop topk_ratio",
                              "topk_ratio", "compression")
        if not 0 < c.topk_ratio <= 1:
            _bad("topk_ratio", c.topk_ratio, "must be in (0, 1] (the fraction of values sent)",
                 example="0.01")
    if c.error_feedback and not toolkit_compression:
        raise ConfigError(f"error_feedback applies to compression bf16, int8, topk or powersgd (got compression="
                          f"{c.compression.value!r}, which loses nothing to feed back); drop it",
                          "error_feedback", "compression")
    exchange_rules.check_dgc_powersgd(c)
    exchange_rules.check_hierarchical(c)
    exchange_rules.check_overlap(c)
    if c.sync is Sync.LOCAL_SGD:
        if c.local_steps is not None and c.local_steps < 1:
            _bad("local_steps", c.local_steps, "must be a positive integer (steps between averages)",
                 example="4")
        if c.compression is Compression.FP16:
            raise ConfigError("compression=fp16 is Horovod's allreduce option and local_sgd does not "
                              "use it; with sync: local_sgd use compression bf16, int8, topk or none",
                              "compression", "sync")
        if c.op is not Op.AVERAGE:
            raise ConfigError(f"op={c.op.value!r} with sync: local_sgd: local SGD averages the "
                              "models; use op: average", "op", "sync")
    else:
        for name in ("local_steps", "sync_warmup_steps"):
            if getattr(c, name):
                raise ConfigError(f"{name} applies to sync: local_sgd; add --sync local_sgd or drop {name}",
                                  name, "sync")
    _check_parameter_server(c)
    if c.sync_warmup_steps < 0:
        _bad("sync_warmup_steps", c.sync_warmup_steps, "must be >= 0", example="0")
    if c.op is Op.ADASUM and toolkit_compression:
        raise ConfigError(f"op=adasum is Horovod's allreduce and compression={c.compression.value!r} "
                          "is the toolkit's exchange; use op: average (or compression none/fp16)", "op", "compression")


def _check_clipping(c, impl) -> None:
    """clip_grad_norm clips the reduced gradient: refused where there is none to clip."""
    where = f"framework={c.framework!r} with backend={c.backend.value!r}" + \
        (f" keras={c.keras.value!r}" if c.keras is not Keras.KERAS3 else "")
    if impl.clip:
        raise ConfigError(f"clip_grad_norm is not available for {where} ({impl.clip}); use backend: horovod "
                          "with keras: keras3, or drop clip_grad_norm",
                          "clip_grad_norm", "framework", "backend", "keras")
    if c.op is Op.ADASUM:
        raise ConfigError("clip_grad_norm with op=adasum: Adasum combines the ranks' updates, there is no "
                          "reduced gradient to clip; use op: average, or drop clip_grad_norm", "clip_grad_norm", "op")
    if c.sync in PS_SYNCS:
        raise ConfigError(f"clip_grad_norm with sync={c.sync.value}: the server applies each worker's "
                          "gradient as it comes, there is no reduced gradient to clip; use sync every_step "
                          "or local_sgd, or drop clip_grad_norm", "clip_grad_norm", "sync")


def _check_parameter_server(c) -> None:
    if c.sync not in PS_SYNCS:
        for name in ("staleness", "ps_servers"):
            if getattr(c, name) is not None:
                raise ConfigError(f"{name} applies to sync: ssp or async_ps (a parameter server); add "
                                  f"--sync ssp or drop {name}", name, "sync")
        if c.staleness_lr_damping:
            raise ConfigError("staleness_lr_damping applies to sync: ssp or async_ps; drop it",
                              "staleness_lr_damping", "sync")
        return
    if c.staleness is not None:
        if c.sync is Sync.ASYNC_PS:
            raise ConfigError("staleness bounds sync: ssp; async_ps has no bound: use --sync ssp or drop staleness",
                              "staleness", "sync")
        if c.staleness < 0:
            _bad("staleness", c.staleness, "must be >= 0 (0 = every worker in step)", example="4")
    if c.ps_servers is not None and c.ps_servers < 1:
        _bad("ps_servers", c.ps_servers, f"must be at least 1: sync={c.sync.value} needs a server rank "
             "to hold the parameters", example="1")
    if c.compression is not Compression.NONE:
        raise ConfigError(f"compression={c.compression.value!r} with sync={c.sync.value}: the parameter "
                          "server exchanges full float32 values; use compression: none", "compression", "sync")
    if c.op is not Op.AVERAGE:
        raise ConfigError(f"op={c.op.value!r} with sync={c.sync.value}: the server applies each "
                          "worker's gradient as it comes; use op: average", "op", "sync")


DATAPARALLEL = ("torch.nn.DataParallel drives every GPU from one process: its threads share one GIL, and GPU 0 "
                "gathers the outputs and scatters the gradients, doing more than the others; PyTorch recommends "
                "DistributedDataParallel, one process per GPU")


def _check_capabilities(c) -> None:
    """What the chosen framework and backend implement (toolkit/registry.py), with the alternative."""
    spec = registry.spec(c.framework)
    backend = c.backend.value
    if c.backend is Backend.DATAPARALLEL:
        raise ConfigError(f"backend=dataparallel is refused: {DATAPARALLEL}; use backend: native (torch DDP, "
                          "one process per GPU) or horovod", "backend")
    if backend not in spec.backends:
        raise ConfigError(f"backend={backend!r} is not available for framework={c.framework!r}; "
                          f"use one of: {', '.join(spec.backends)}", "backend", "framework")
    impl = spec.implementation(backend, c.keras.value)
    for name, allowed in (("op", impl.ops), ("compression", impl.compressions), ("sync", impl.syncs)):
        value = getattr(c, name).value
        if value not in allowed and value != "auto":     # compression auto picks among the allowed ones
            keras = f" keras={c.keras.value!r}" if c.keras is not Keras.KERAS3 else ""
            raise ConfigError(f"{name}={value!r} is not available for framework={c.framework!r} with "
                              f"backend={backend!r}{keras} ({impl.why_not}); use {name}: {' or '.join(allowed)}",
                              name, "framework", "backend", "keras")
    if c.uneven_data and c.sync not in PS_SYNCS and not impl.join:
        raise ConfigError(f"uneven_data is not available for framework={c.framework!r} with backend={backend!r}"
                          f"{' keras=' + repr(c.keras.value) if c.keras is not Keras.KERAS3 else ''} "
                          "(hvd.join is used for torch only); use framework torch, or sync ssp",
                          "uneven_data", "framework", "backend", "keras", "sync")
    if c.model in impl.models_refused:
        raise ConfigError(f"model={c.model!r} is not available for framework={c.framework!r} with "
                          f"backend={backend!r} ({impl.models_refused[c.model]}); use another framework "
                          "or your own model (model: pkg.module:build)", "model", "framework", "backend")
    if c.clip_grad_norm is not None:
        _check_clipping(c, impl)
    if c.compile and c.framework != "torch":
        raise ConfigError(f"compile is torch's (torch.compile); with framework={c.framework!r} drop compile",
                          "compile", "framework")
    if c.sync_batchnorm and impl.sync_batchnorm:
        raise ConfigError(f"sync_batchnorm is not available for framework={c.framework!r} with "
                          f"backend={backend!r} ({impl.sync_batchnorm}); drop sync_batchnorm",
                          "sync_batchnorm", "framework", "backend")
    if c.precision.value not in impl.precisions:
        raise ConfigError(f"precision={c.precision.value!r} is not available for framework={c.framework!r} "
                          f"with backend={backend!r} ({impl.why_not_precision}); use precision: "
                          f"{' or '.join(impl.precisions)}", "precision", "framework", "backend", "keras")
    if c.precision is Precision.FP16 and (c.toolkit_exchange or c.sync in PS_SYNCS or c.op is Op.ADASUM):
        raise ConfigError(f"precision=fp16 scales the loss and unscales the reduced gradient around Horovod's "
                          f"allreduce; with compression={c.compression.value!r}, sync={c.sync.value!r}, "
                          f"op={c.op.value!r} there is none: use precision bf16, or compression none/fp16, "
                          "sync every_step and op average/sum", "precision", "compression", "sync", "op")
    if c.sharding is not Sharding.NONE:
        _check_sharding(c, impl)
    if c.elastic and not impl.elastic:
        raise ConfigError(f"elastic training is not available for framework={c.framework!r} with "
                          f"backend={backend!r} ({impl.why_not_elastic}); drop the elastic keys",
                          *ELASTIC, "framework", "backend", "keras")
    if c.keras is not Keras.KERAS3 and c.framework != "tensorflow":
        raise ConfigError(f"keras={c.keras.value!r} applies to framework: tensorflow only; drop it",
                          "keras", "framework")
    if c.keras is Keras.TF_KERAS and c.backend is Backend.NATIVE:
        raise ConfigError("keras='tf_keras' runs on backend: horovod (horovod.tensorflow.keras); "
                          "the native strategies run Keras 3 here: drop keras or use --backend horovod",
                          "keras", "backend")
    if c.strategy is not None and c.backend is not Backend.NATIVE:
        raise ConfigError(f"strategy={c.strategy.value!r} needs backend: native (with backend horovod, "
                          "Horovod does the communication); add --backend native or drop strategy",
                          "strategy", "backend")
    if c.num_devices is not None:
        if c.num_devices < 1:
            _bad("num_devices", c.num_devices, "must be a positive integer", example="2")
        if c.backend is not Backend.NATIVE or c.strategy is TfStrategy.MULTI_WORKER_MIRRORED:
            raise ConfigError("num_devices applies to strategy: mirrored (one process, several devices); "
                              "elsewhere each rank has one device: set the number of ranks with -np",
                              "num_devices", "backend", "strategy")


def _check_workload(c) -> None:
    """The built-in models' own keys, and which data each one reads."""
    disk = on_disk(c.dataset)
    if disk and not disk[1]:
        raise ConfigError(f"dataset={c.dataset!r}: no path after the colon; e.g. --dataset {disk[0]}:data/"
                          f"{dict(text='corpus.txt', shards='shards').get(disk[0], 'images')}", "dataset")
    if c.context < 2:
        _bad("context", c.context, "must be at least 2 (tokens per sample)", example="64")
    if c.image_size is not None and c.image_size < 32:
        _bad("image_size", c.image_size, "must be at least 32 (the ResNets downsample by 32)", example="32")
    if c.image_size is not None and disk and disk[0] == "cifar10":
        raise ConfigError("image_size does not apply to cifar10 (its images are 32x32); drop image_size",
                          "image_size", "dataset")
    if c.model == Model.TRANSFORMER_LM.value and c.hidden_size % c.heads:
        raise ConfigError(f"hidden_size={c.hidden_size} is not a multiple of heads={c.heads} "
                          "(transformer_lm splits the width across the heads); e.g. --hidden-size 64 --heads 4",
                          "hidden_size", "heads")
    shards = bool(disk and disk[0] == "shards")   # images or tokens: the shards' index says (checked at load)
    text = bool(disk and disk[0] == "text")
    if c.model == Model.TRANSFORMER_LM.value and not (text or shards or c.dataset == Dataset.SYNTHETIC.value
                                                         or is_reference(c.dataset)):
        raise ConfigError(f"model=transformer_lm reads tokens: use dataset text:PATH (a plain text file) or "
                          f"synthetic, not {c.dataset!r}", "model", "dataset")
    if text and c.model != Model.TRANSFORMER_LM.value and not is_reference(c.model):
        raise ConfigError(f"dataset={c.dataset!r} gives token sequences: use model transformer_lm (or your "
                          f"own), not {c.model!r}", "dataset", "model")
    images = bool(disk and disk[0] not in ("text", "shards"))
    if c.model in IMAGE_MODELS and not (images or shards or c.dataset == Dataset.SYNTHETIC.value
                                           or is_reference(c.dataset)):
        raise ConfigError(f"model={c.model} reads images: use dataset imagefolder:PATH, cifar10:PATH or "
                          f"synthetic, not {c.dataset!r}", "model", "dataset")
    if images and c.model in (Model.MLP.value, Model.LINEAR.value):
        raise ConfigError(f"dataset={c.dataset!r} gives images: use model resnet18 or resnet50 (or your "
                          f"own), not {c.model!r}", "dataset", "model")


def _check_sharding(c, impl) -> None:
    """sharding zero1 / fsdp: torch's own engine only, and what each shards leaves no room for."""
    name = c.sharding.value
    if name not in impl.sharding:
        raise ConfigError(f"sharding={name!r} is not available for framework={c.framework!r} with "
                          f"backend={c.backend.value!r} (ZeRO and FSDP shard through torch.distributed); use "
                          "framework torch with backend: native, or sharding: none", "sharding", "framework", "backend")
    if c.toolkit_exchange:
        raise ConfigError(f"sharding={name!r} with compression={c.compression.value!r}, sync={c.sync.value!r}: the "
                          "toolkit's exchange moves every rank's whole gradient; use compression none/fp16/bf16 "
                          "and sync every_step, or sharding: none", "sharding", "compression", "sync")
    if c.uneven_data:
        raise ConfigError(f"sharding={name!r} with uneven_data: a sharded step needs every rank; drop "
                          "uneven_data or use sharding: none", "sharding", "uneven_data")
    if c.sharding is Sharding.FSDP:
        if c.compression.value not in ("none", "auto"):
            raise ConfigError(f"sharding='fsdp' with compression={c.compression.value!r}: FSDP reduce-scatters in "
                              "the dtype of its mixed-precision policy (precision bf16 reduces in float32); "
                              "use compression: none", "sharding", "compression")
        if c.precision is Precision.FP16:
            raise ConfigError("sharding='fsdp' with precision=fp16: fp16 needs a loss scaler over sharded "
                              "gradients; use precision: bf16 (FSDP's mixed-precision policy), or sharding: zero1",
                              "sharding", "precision")
