"""`Config`: one frozen, validated, flat dataclass composed from the groups' fields (groups.py), so every key is
an attribute (`config.lr`) and `dataclasses.fields(Config)` lists them in the interface's order. Each field keeps
its group in `metadata["group"]`.

Constructing a Config (directly, through `dataclasses.replace` or `from_dict`) validates it (rules.py) and returns
it complete: the keys whose default depends on others are filled in by derived.complete, a new Config.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Mapping

from toolkit.errors import ToolkitError

from . import derived, rules
from .values import ConfigError, _coerce, flatten_groups, origins_named
from .enums import PS_SYNCS, TOOLKIT_COMPRESSIONS, Sync
from .groups import ELASTIC_KEYS, GROUPS, KEYS, ORDER, _plain


class _Complete(type):
    """`Config(...)`: the dataclass's own construction (validation in __post_init__), then the derived values."""

    def __call__(cls, *args, **kwargs):
        return derived.complete(super().__call__(*args, **kwargs))


def _compose(cls):
    """Give `cls` every group's fields, in ORDER, each with its group in its metadata; a frozen dataclass."""
    cls.__annotations__ = {name: KEYS[name][2] for name in ORDER}
    for name in ORDER:
        group, f, _ = KEYS[name]
        setattr(cls, name, dataclasses.field(default=f.default, metadata={**f.metadata, "group": group}))
    return dataclass(frozen=True)(cls)


@_compose
class Config(metaclass=_Complete):
    """Every key of every group (groups.py), validated (rules.py), complete (derived.py)."""

    def quiet_framework_logs(self) -> None:
        """Before the framework is imported: TensorFlow's C++ INFO lines off stderr (toolkit/run/quiet.py)."""
        if self.framework == "tensorflow" and not self.framework_logs:
            from toolkit.run import quiet
            quiet.filter_stderr()

    def __post_init__(self):
        rules.validate(self)

    @property
    def elastic(self) -> bool:
        return any(getattr(self, f"elastic_{k}") is not None for k in ELASTIC_KEYS)

    def data_fractions(self) -> dict[int, float]:
        """{rank: fraction of its batches it trains on} from `uneven_data`."""
        fractions = rules._rank_values("uneven_data", self.uneven_data, lambda v: 0 <= v <= 1,
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
        ms = rules._rank_values("straggler", self.straggler, lambda v: v >= 0,
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
        return self.compression in TOOLKIT_COMPRESSIONS or self.sync in (Sync.LOCAL_SGD, *PS_SYNCS)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_yaml(self) -> str:
        """The config as YAML in the README's form: the elastic keys as one `elastic:` block, and an
        unset key whose value depends on others (`staleness`, `topk_ratio`, ...) commented with it.
        `--config` reads it back to the same Config."""
        import yaml
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
            return cls(**{k: _coerce(kinds[k], v) for k, v in values.items()})
