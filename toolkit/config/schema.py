"""`Config`: one frozen, validated, flat dataclass composed from the groups' fields (groups.py), so every key is
an attribute (`config.lr`) and `dataclasses.fields(Config)` lists them in the interface's order. Each field keeps
its group in `metadata["group"]`. The keys are declared in the class body, each with its type as groups.py writes
it and groups.py's field, so that editors and type checkers see them; the class is not built when the two differ,
and tests/test_config.py fails until the block is what `docs.declarations()` prints.

Constructing a Config (directly, through `dataclasses.replace` or `from_dict`) validates it (rules.py) and returns
it complete: the keys whose default depends on others are filled in by derived.complete, a new Config.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Mapping, Optional, dataclass_transform

from toolkit.errors import ToolkitError

from . import derived, rules
from .enums import (
    PS_SYNCS,
    TOOLKIT_COMPRESSIONS,
    Backend,
    CheckpointFormat,
    Compression,
    Keras,
    LrScaling,
    LrSchedule,
    Op,
    Optimizer,
    Precision,
    Sharding,
    Sync,
    TfStrategy,
)
from .groups import ELASTIC_KEYS, GROUPS, KEYS, ORDER, plain
from .values import ConfigError, coerce, flatten_groups, origins_named


class _Complete(type):
    """`Config(...)`: the dataclass's own construction (validation in __post_init__), then the derived values."""

    def __call__(cls, *args, **kwargs):
        return derived.complete(super().__call__(*args, **kwargs))


def _key(name: str) -> Any:
    """`name`'s field in Config: its group's default and metadata, with the group in it."""
    group, f, _ = KEYS[name]
    return dataclasses.field(default=f.default, metadata={**f.metadata, "group": group})


@dataclass_transform(frozen_default=True)
def _compose(cls):
    """`cls`, which declares every group's key in ORDER as groups.py writes its type, as a frozen dataclass whose
    types are the groups' resolved ones."""
    written = [(name, KEYS[name][1].type) for name in ORDER]
    assert list(cls.__annotations__.items()) == written, \
        "Config's keys differ from groups.py: paste docs.declarations() into toolkit/config/schema.py"
    cls.__annotations__ = {name: KEYS[name][2] for name in ORDER}
    return dataclass(frozen=True)(cls)


@_compose
class Config(metaclass=_Complete):
    """Every key of every group (groups.py), validated (rules.py), complete (derived.py)."""

    # Generated from groups.py: `docs.declarations()`.
    framework: str = _key("framework")
    backend: Backend = _key("backend")
    sharding: Sharding = _key("sharding")
    keras: Keras = _key("keras")
    strategy: Optional[TfStrategy] = _key("strategy")
    num_devices: Optional[int] = _key("num_devices")
    model: str = _key("model")
    hidden_size: int = _key("hidden_size")
    hidden_layers: int = _key("hidden_layers")
    heads: int = _key("heads")
    context: int = _key("context")
    dataset: str = _key("dataset")
    image_size: Optional[int] = _key("image_size")
    augment: bool = _key("augment")
    epochs: int = _key("epochs")
    batch_size: int = _key("batch_size")
    optimizer: Optimizer = _key("optimizer")
    lr: float = _key("lr")
    momentum: float = _key("momentum")
    weight_decay: float = _key("weight_decay")
    lr_scaling: LrScaling = _key("lr_scaling")
    warmup_epochs: float = _key("warmup_epochs")
    lr_schedule: LrSchedule = _key("lr_schedule")
    lr_step_epochs: Optional[float] = _key("lr_step_epochs")
    lr_step_gamma: Optional[float] = _key("lr_step_gamma")
    compression: Compression = _key("compression")
    topk_ratio: Optional[float] = _key("topk_ratio")
    dgc: bool = _key("dgc")
    dgc_warmup_epochs: Optional[int] = _key("dgc_warmup_epochs")
    dgc_masking: bool = _key("dgc_masking")
    powersgd_rank: Optional[int] = _key("powersgd_rank")
    powersgd_warmup_steps: int = _key("powersgd_warmup_steps")
    error_feedback: Optional[bool] = _key("error_feedback")
    hierarchical_exchange: Optional[bool] = _key("hierarchical_exchange")
    overlap: Optional[bool] = _key("overlap")
    bucket_mb: float = _key("bucket_mb")
    sync: Sync = _key("sync")
    local_steps: Optional[int] = _key("local_steps")
    sync_warmup_steps: int = _key("sync_warmup_steps")
    staleness: Optional[int] = _key("staleness")
    ps_servers: Optional[int] = _key("ps_servers")
    staleness_lr_damping: bool = _key("staleness_lr_damping")
    accumulation_steps: int = _key("accumulation_steps")
    op: Op = _key("op")
    precision: Precision = _key("precision")
    compile: bool = _key("compile")
    sync_batchnorm: bool = _key("sync_batchnorm")
    clip_grad_norm: Optional[float] = _key("clip_grad_norm")
    nan_guard: bool = _key("nan_guard")
    nan_check_every: int = _key("nan_check_every")
    seed: int = _key("seed")
    checkpoint_dir: Optional[str] = _key("checkpoint_dir")
    keep_checkpoints: int = _key("keep_checkpoints")
    checkpoint_format: CheckpointFormat = _key("checkpoint_format")
    checkpoint_async: bool = _key("checkpoint_async")
    resume: bool = _key("resume")
    preemption_check_every: int = _key("preemption_check_every")
    log_dir: Optional[str] = _key("log_dir")
    wandb_project: Optional[str] = _key("wandb_project")
    mlflow_tracking_uri: Optional[str] = _key("mlflow_tracking_uri")
    mlflow_experiment: Optional[str] = _key("mlflow_experiment")
    mlflow_run_name: Optional[str] = _key("mlflow_run_name")
    peak_tflops: Optional[float] = _key("peak_tflops")
    profile_dir: Optional[str] = _key("profile_dir")
    profile_steps: str = _key("profile_steps")
    fusion_threshold_mb: Optional[float] = _key("fusion_threshold_mb")
    cycle_time_ms: Optional[float] = _key("cycle_time_ms")
    timeline_file: Optional[str] = _key("timeline_file")
    stall_check_seconds: Optional[float] = _key("stall_check_seconds")
    elastic_min_np: Optional[int] = _key("elastic_min_np")
    elastic_max_np: Optional[int] = _key("elastic_max_np")
    elastic_discovery: Optional[str] = _key("elastic_discovery")
    elastic_commit_every: Optional[int] = _key("elastic_commit_every")
    uneven_data: Optional[str] = _key("uneven_data")
    straggler: Optional[str] = _key("straggler")
    allow_cpu: bool = _key("allow_cpu")
    loader_workers: int = _key("loader_workers")
    quiet: bool = _key("quiet")
    framework_logs: bool = _key("framework_logs")

    def __post_init__(self):
        rules.validate(self)

    @property
    def elastic(self) -> bool:
        return any(getattr(self, f"elastic_{k}") is not None for k in ELASTIC_KEYS)

    def data_fractions(self) -> dict[int, float]:
        """{rank: fraction of its batches it trains on} from `uneven_data`."""
        fractions = rules.rank_values("uneven_data", self.uneven_data, lambda v: 0 <= v <= 1,
                                       f"uneven_data={self.uneven_data!r}: "
                                       "expected RANK:FRACTION[,RANK:FRACTION] with RANK >= 0 and FRACTION in [0, 1], "
                                       "e.g. --uneven-data 1:0.5")
        if fractions and self.sync not in PS_SYNCS:
            if self.toolkit_exchange or self.elastic:
                raise ConfigError("uneven_data under sync every_step needs Horovod's join in its distributed "
                                  "optimizer: drop compression bf16/int8/topk/powersgd, local_sgd and elastic, "
                                  "or use sync ssp", "uneven_data", "compression", "sync",
                                  *(f"elastic_{k}" for k in ELASTIC_KEYS))
        return fractions

    def straggler_delays(self) -> dict[int, float]:
        """{rank: seconds to sleep before each step} from `straggler`."""
        ms = rules.rank_values("straggler", self.straggler, lambda v: v >= 0,
                                f"straggler={self.straggler!r}: expected RANK:MS[,RANK:MS] with RANK >= 0 and MS >= 0 "
                                "milliseconds, e.g. --straggler 1:50")
        return {rank: value / 1000 for rank, value in ms.items()}

    @property
    def optimizer_momentum(self) -> float:
        """The momentum the built-in SGD runs with: none under dgc, whose exchange applies it."""
        return 0.0 if self.dgc else self.momentum

    @property
    def toolkit_exchange(self) -> bool:
        """Whether the toolkit moves the gradients (toolkit/exchange/communication.py or, for a parameter
        server, toolkit/run/ps.py) instead of Horovod's optimizer."""
        return (self.compression in TOOLKIT_COMPRESSIONS or self.sync in (Sync.LOCAL_SGD, *PS_SYNCS)
                or self.hierarchical_exchange is True)

    @property
    def hierarchical_capable(self) -> bool:
        """Whether the exchange can run in two levels (toolkit/exchange/hierarchy.py): bf16 or int8 (or
        compression none with hierarchical_exchange: true; auto, which may choose them), every step, not elastic."""
        methods = ((Compression.BF16, Compression.INT8, Compression.AUTO)
                   + ((Compression.NONE,) if self.hierarchical_exchange else ()))
        return self.compression in methods and self.sync is Sync.EVERY_STEP and not self.elastic

    @property
    def overlap_capable(self) -> bool:
        """Whether the exchange can run in buckets beside the backward pass (toolkit/exchange/buckets.py): what
        can run hierarchical (its blocks split at any bucket boundary), with the toolkit's exchange, on torch."""
        return self.toolkit_exchange and self.hierarchical_capable and not self.dgc

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_yaml(self) -> str:
        """The config as YAML in the README's form: the elastic keys as one `elastic:` block, and an
        unset key whose value depends on others (`staleness`, `topk_ratio`, ...) commented with it.
        `--config` reads it back to the same Config."""
        import yaml
        grouped: dict
        values, grouped = self.to_dict(), {}
        for name, value in values.items():
            group = next((g for g in GROUPS if name.startswith(f"{g}_") and name[len(g) + 1:] in GROUPS[g]), None)
            if group:
                grouped.setdefault(group, {})[name[len(group) + 1:]] = value
            else:
                grouped[name] = value
        unset = {f.name: f.metadata["unset_text"] for f in dataclasses.fields(self) if "unset_text" in f.metadata}
        lines, group = [], None
        for line in yaml.safe_dump(grouped, sort_keys=False).splitlines():
            key = line.strip().split(":", 1)[0]
            nested = line.startswith(" ")
            name = f"{group}_{key}" if nested else key
            if not nested:
                group = key
            if line.endswith(": null") and name in unset:
                line += f"  # unset: {unset[name]}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config") -> "Config":
        kinds = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in values if k not in kinds]
        if unknown:
            key = unknown[0]
            near = difflib.get_close_matches(str(key), kinds, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ToolkitError(f"{source}: unknown key {key!r}; {hint}allowed keys: {', '.join(kinds)}")
        values = flatten_groups(values, source)
        with origins_named(dict.fromkeys(values, source)):
            return cls(**{k: coerce(kinds[k], v) for k, v in values.items()})
