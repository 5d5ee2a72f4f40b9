"""Where keys come from, lowest to highest: defaults < YAML file (`--config`) < `TOOLKIT_*` environment < CLI
flags. Only what a source really sets is merged. Every field is also a flag (`accumulation_steps` ->
`--accumulation-steps`) and an environment variable (`TOOLKIT_ACCUMULATION_STEPS`). A raw value becomes the
field's type here (`coerce`), or a one-line ToolkitError naming the key and the fix.

This is the one place that knows where each value came from, so every error about values (a type, a choice, a
range, keys that do not go together: values.ConfigError, raised by values.py and rules.py) ends here with the
source of each key it is about: `(lr from TOOLKIT_LR)`, `(lr from --lr)`, `(lr from c.yaml, key lr)`.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from toolkit.errors import ToolkitError

from .enums import Backend, Keras
from .groups import flag, plain
from .schema import Config
from .values import TRUE_WORDS, base_type, coerce, flatten_groups, origins_named

ENV_PREFIX = "TOOLKIT_"
# TOOLKIT_* variables that are not config fields (read by other parts of the toolkit).
ENV_RESERVED = frozenset({"TOOLKIT_CACHE_DIR", "TOOLKIT_REQUIRE_GPU", "TOOLKIT_REQUIRE_MULTIHOST",
                          "TOOLKIT_REQUIRE_ENGINES"})


def read_yaml(path: str | os.PathLike, spelled: Optional[dict] = None) -> dict[str, Any]:
    """The file's keys, flattened (`elastic: {min_np: 2}` -> elastic_min_np); `spelled` receives each key as the
    file writes it (`elastic.min_np`), for messages."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ToolkitError(f"--config {path}: file not found; check the path")
    text = p.read_text()
    if not text.strip():
        raise ToolkitError(f"--config {path}: the file is empty; write at least one key, e.g. `epochs: 5`")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ToolkitError(f"--config {path}: invalid YAML{at}: {problem}") from None
    if data is None:
        raise ToolkitError(f"--config {path}: no keys (only comments?); write at least one, e.g. `epochs: 5`")
    if not isinstance(data, dict):
        raise ToolkitError(f"--config {path}: expected `key: value` lines at the top level, "
                           f"got a {type(data).__name__}")
    return flatten_groups(data, f"--config {path}", spelled)


def command_keys(command: Sequence[str]) -> dict[str, Any]:
    """The keys of the YAML file a command line passes with `--config FILE` (or `--config=FILE`; the last one,
    as argparse takes it), {} without one: what `toolkit launch` learns of its ranks' config (their elastic
    block, their checkpoint_dir for `--emit slurm`)."""
    path = None
    for i, arg in enumerate(command):
        if arg == "--config" and i + 1 < len(command):
            path = command[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    return read_yaml(path) if path is not None else {}


def read_env(environ: Mapping[str, str]) -> dict[str, str]:
    names = {f.name for f in dataclasses.fields(Config)}
    values = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or key in ENV_RESERVED:
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {ENV_PREFIX}{near[0].upper()}? " if near else ""
            raise ToolkitError(f"environment: unknown variable {key}; {hint}unset it or use one of "
                               f"{ENV_PREFIX}<FIELD> for the fields in `toolkit config show`")
        values[name] = value
    return values


# The usage line of a command whose flags are the config's (the list of every flag would fill a screen).
USAGE = "[--config FILE.yaml] [--KEY VALUE | --[no-]FLAG ...] (every config key: --help)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config` plus one flag per field. Defaults are SUPPRESSed so only what the user set exists."""
    parser.add_argument("--config", metavar="FILE.yaml", default=argparse.SUPPRESS,
                        help="YAML file of config keys (below flags and TOOLKIT_* in precedence)")
    group = parser.add_argument_group("config (also YAML keys and TOOLKIT_<KEY> variables)")
    for f in dataclasses.fields(Config):
        kind, _ = base_type(f)
        # argparse formats help with %: a literal percent sign is written twice
        help_text = f.metadata["help"].replace("%", "%%") + f" (default: {plain(f.default)})"
        if kind is bool:
            group.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
            continue
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            help_text += " {" + ",".join(m.value for m in kind) + "}"
        elif "choices" in f.metadata:
            help_text += " {" + ",".join(f.metadata["choices"]()) + "}"
        group.add_argument(flag(f.name), dest=f.name, metavar=f.name.upper(), default=argparse.SUPPRESS,
                           help=help_text)


def load(source: "str | os.PathLike | Mapping[str, Any] | Config | None" = None, **keys) -> Config:
    """The config of `toolkit.start(...)`: a YAML file's path, a dict of keys, a Config, or nothing;
    then TOOLKIT_* variables; then `keys` (keyword arguments win, as flags do on the command line)."""
    if isinstance(source, Config):
        with origins_named(dict.fromkeys(keys, "start()")):
            return dataclasses.replace(source, **{k: coerce(_field(k, "start()"), v) for k, v in keys.items()})
    if source is None or isinstance(source, Mapping):
        return resolve(keys, base=dict(source or {}), named="start()")
    return resolve({"config": str(source), **keys}, named="start()")


def _field(name: str, source: str) -> dataclasses.Field:
    kinds = {f.name: f for f in dataclasses.fields(Config)}
    if name not in kinds:
        Config.from_dict({name: None}, source=source)      # words the error (nearest key, allowed keys)
    return kinds[name]


def resolve(args: argparse.Namespace | Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None, base: Mapping[str, Any] | None = None,
            named: str | None = None) -> Config:
    """defaults < `base` (a dict of keys) < YAML (`config` in args) < TOOLKIT_* environment < CLI values in `args`.
    `named`: what an error calls the source of `args` (default: their flags; "start()" for keyword arguments)."""
    cli = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    names = {f.name for f in dataclasses.fields(Config)}
    path = cli.pop("config", None)
    merged: dict[str, tuple[Any, str]] = {}     # key -> (raw value, the source that set it)
    origins: dict[str, str] = {}                # key -> its source, as an error about its value names it
    if base:
        merged.update({k: (v, "start()") for k, v in flatten_groups(base, "start()").items()})
        origins.update(dict.fromkeys(merged, "start()"))
    if path is not None:
        spelled: dict[str, str] = {}
        merged.update({k: (v, path) for k, v in read_yaml(path, spelled).items()})
        origins.update({k: f"{path}, key {written}" for k, written in spelled.items()})
    environ = os.environ if environ is None else environ
    for source in ({k: (v, f"{ENV_PREFIX}{k.upper()}") for k, v in read_env(environ).items()},
                   {k: (v, named or flag(k)) for k, v in cli.items() if k in names}):
        merged.update(source)
        origins.update({k: src for k, (_, src) in source.items()})
    kinds = {f.name: f for f in dataclasses.fields(Config)}
    unknown = [k for k in merged if k not in kinds]
    if unknown:
        # from_dict words the message (nearest key, allowed keys)
        Config.from_dict({unknown[0]: None}, source=merged[unknown[0]][1])
    with origins_named(origins):
        values = {k: coerce(kinds[k], v) for k, (v, _) in merged.items()}
        if ("keras" not in values and values.get("framework") == "tensorflow"
                and values.get("backend", Backend.HOROVOD) is Backend.HOROVOD
                and str(environ.get("TF_USE_LEGACY_KERAS", "")).lower() in TRUE_WORDS):
            values["keras"] = Keras.TF_KERAS     # TensorFlow's own switch for legacy Keras, honoured
            origins["keras"] = f"TF_USE_LEGACY_KERAS={environ['TF_USE_LEGACY_KERAS']}"
        return Config(**values)
