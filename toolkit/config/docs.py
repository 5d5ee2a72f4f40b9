"""What is generated from the fields (groups.py): docs/CONFIG.md (`render()`: `python -m toolkit config docs >
docs/CONFIG.md`) and Config's declarations of the keys in schema.py (`declarations()`). tests/test_config.py fails
when either differs from what these functions write."""
from __future__ import annotations

import dataclasses
import enum

from .groups import GROUP_CLASSES, GROUPS, KEYS, ORDER, _show, base_type, flag
from .sources import ENV_PREFIX


def _default(f: dataclasses.Field) -> str:
    """The default; for None `unset` (what unset means, where it means more than "off", is in the help)."""
    return "unset" if f.default is None else f"`{_show(f.default)}`"


def _choices(f: dataclasses.Field) -> str:
    kind, _ = base_type(f.name)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " One of: " + ", ".join(f"`{m.value}`" for m in kind) + "."
    if "choices" in f.metadata:
        return " One of: " + ", ".join(f"`{c}`" for c in f.metadata["choices"]()) + "."
    return ""


def render() -> str:
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from toolkit/config/groups.py by `python -m toolkit config docs > docs/CONFIG.md`; "
        "do not edit by hand (tests/test_config.py fails when this file is stale). -->",
        "",
        "Every key is a YAML key (`--config FILE.yaml`), a flag and a `TOOLKIT_<KEY>` environment variable. "
        "Precedence, lowest to highest: the defaults below < the YAML file < `TOOLKIT_*` < flags; only what a "
        "source sets is merged. `toolkit config show` prints the resolved config as YAML (rank 0 writes the same "
        "beside its checkpoints). A boolean flag also has its `--no-` form.",
        "",
    ]
    for group in GROUP_CLASSES:
        yaml_group = f" (YAML: an `{group.group}:` block of the keys without the `{group.group}_` prefix)" \
            if group.group in GROUPS else ""
        lines += [f"## {group.group}", "", group.__doc__.strip() + yaml_group, "",  # type: ignore[union-attr]  # each has one
                  "| key | flag | environment | default | meaning |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(group):
            meaning = (f.metadata["help"] + "." + _choices(f)).replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{flag(f.name)}` | `{ENV_PREFIX}{f.name.upper()}` | {_default(f)} | "
                         f"{meaning} |")
        lines.append("")
    return "\n".join(lines)


def declarations() -> str:
    """The keys as Config's class body in schema.py declares them: in ORDER, each with its type as groups.py
    writes it and its field."""
    return "".join(f'    {name}: {KEYS[name][1].type} = _key("{name}")\n' for name in ORDER)
