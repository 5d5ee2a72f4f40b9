"""One frozen, validated `Config` for every framework (docs/CONFIG.md lists every key).

Sources, lowest to highest: defaults < YAML file (`--config`) < `TOOLKIT_*` environment < CLI flags.
Only what a source really sets is merged. Every field is also a flag (`accumulation_steps` ->
`--accumulation-steps`) and an environment variable (`TOOLKIT_ACCUMULATION_STEPS`).
Bad input raises `ToolkitError` with one line naming the key, where it came from, and the fix.

    enums.py    the str enums of the fixed choices
    groups.py   the keys: one small dataclass per group, default in the field, help in its metadata
    schema.py   `Config`, the flat frozen dataclass composed from the groups
    rules.py    validation: one key's range, keys across groups, what the framework and backend implement
    derived.py  the defaults that depend on other keys, filled in by a step that returns a new Config
    values.py   a source's raw values coerced to each key's type (one-line errors), YAML groups flattened
    sources.py  YAML, TOOLKIT_* environment, flags, and their merge (`resolve`, `load`)
    docs.py     docs/CONFIG.md, generated from the fields (`toolkit config docs`)
"""
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
    LrScaling,
    LrSchedule,
    Model,
    Op,
    Optimizer,
    Precision,
    Sharding,
    Sync,
    TfStrategy,
)
from .groups import (
    ELASTIC_KEYS,
    GROUP_CLASSES,
    GROUPS,
    ORDER,
    CheckpointConfig,
    CommunicationConfig,
    ElasticConfig,
    HorovodConfig,
    LaunchConfig,
    ParameterServerConfig,
    PrecisionConfig,
    WorkloadConfig,
    flag,
    unset_default,
)
from .rules import is_reference, on_disk
from .schema import Config
from .sources import (
    ENV_PREFIX,
    ENV_RESERVED,
    USAGE,
    add_arguments,
    command_keys,
    load,
    read_env,
    read_yaml,
    resolve,
)
from .values import ConfigError, flatten_groups

# The TensorFlow strategy enum's earlier name (adapters/strategy.py's Strategy is another thing).
Strategy = TfStrategy

__all__ = [
    "Backend", "CheckpointConfig", "CheckpointFormat", "Sharding", "CommunicationConfig", "Compression", "Config", "ConfigError", "Dataset",
    "ELASTIC_KEYS", "ENV_PREFIX", "ENV_RESERVED", "ElasticConfig", "GROUPS", "GROUP_CLASSES", "HorovodConfig",
    "IMAGE_MODELS", "Keras", "LaunchConfig", "LrSchedule", "LrScaling", "Model", "ON_DISK", "ORDER", "Op",
    "Optimizer", "PS_SYNCS", "ParameterServerConfig", "Precision", "PrecisionConfig", "Strategy", "Sync", "TfStrategy",
    "TOOLKIT_COMPRESSIONS", "USAGE", "WorkloadConfig", "add_arguments", "command_keys", "flag", "flatten_groups",
    "is_reference", "load", "on_disk", "read_env", "read_yaml", "resolve", "unset_default",
]
