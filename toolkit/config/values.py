"""A source's raw values (YAML, `TOOLKIT_*`, flags, a dict) as typed keys: each coerced to its field's type
with a one-line error naming the key and an example; YAML groups flattened. `ConfigError`: the error about
keys' values, which the merge of the sources (sources.py) completes with where each value came from."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
from typing import Any, Mapping, Optional

from toolkit.errors import ToolkitError

from .groups import GROUPS, _example, flag
from .groups import base_type as _key_type


def base_type(f: dataclasses.Field):
    """(the field's type without Optional, whether None is allowed)."""
    return _key_type(f.name)


class ConfigError(ToolkitError):
    """A value of the config is wrong (its type, its range, or how it goes with other keys); `keys` are the keys
    the message is about. Only the merge of the sources knows where each value came from, so a rule names the
    keys and `located` names their sources: one place words "from" for every rule."""

    def __init__(self, message: str, *keys: str):
        super().__init__(message)
        self.keys = keys

    def located(self, origins: Mapping[str, str]) -> "ConfigError":
        """The message ending with where each of its keys that a source set came from, e.g. `(lr from
        TOOLKIT_LR)`, `(topk_ratio from --topk-ratio; compression from c.yaml, key compression)`; a key left
        at its default is not named."""
        named = [f"{key} from {origins[key]}" for key in dict.fromkeys(self.keys) if key in origins]
        return ConfigError(f"{self} ({'; '.join(named)})", *self.keys) if named else self


@contextlib.contextmanager
def origins_named(origins: Mapping[str, str]):
    """A ConfigError raised inside names where its keys' values came from (`origins`: key -> source)."""
    try:
        yield
    except ConfigError as e:
        raise e.located(origins) from None


TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def coerce(f: dataclasses.Field, raw):
    """Turn a YAML, environment or CLI value into the field's type, or say what was expected (ConfigError)."""
    kind, optional = base_type(f)
    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "null"))):
        return None
    text = raw.strip() if isinstance(raw, str) else raw
    try:
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return kind(str(text).lower())
        if "choices" in f.metadata:
            choices = f.metadata["choices"]()
            if str(text) not in choices:
                raise ConfigError(f"{f.name}={raw!r} not found. Available: {', '.join(choices)}", f.name)
            return str(text)
        if kind is bool:
            if isinstance(text, bool):
                return text
            if str(text).lower() in TRUE_WORDS | _FALSE:
                return str(text).lower() in TRUE_WORDS
            raise ValueError
        if kind is int:
            if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
                raise ValueError
            return int(text)
        if kind is float:
            if isinstance(text, bool):
                raise ValueError
            return float(text)
        if kind is str:
            if not isinstance(text, (str, int, float)) or isinstance(text, bool):
                raise ValueError
            return str(text)
    except (ValueError, TypeError):
        pass
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind)
    if expected is None:
        expected = "one of: " + ", ".join(m.value for m in kind)
    raise ConfigError(f"{f.name}={raw!r} must be {expected}; e.g. {flag(f.name)} {_example(f.name)}", f.name)


def flatten_groups(data: Mapping[str, Any], source: str, spelled: Optional[dict] = None) -> dict[str, Any]:
    """`elastic: {min_np: 2}` -> `elastic_min_np: 2` (a YAML group is its keys with a prefix). `spelled`, when
    given, receives each key as the source wrote it (`elastic_min_np` -> `elastic.min_np`), for messages."""
    out = {}
    spelled = {} if spelled is None else spelled
    for key, value in data.items():
        if key not in GROUPS:
            out[key], spelled[key] = value, key
            continue
        if not isinstance(value, dict):
            raise ToolkitError(f"{source}: `{key}` is a group of keys ({', '.join(GROUPS[key])}); write e.g. "
                               f"`{key}: {{{GROUPS[key][0]}: 2}}`")
        for sub, v in value.items():
            if sub not in GROUPS[key]:
                near = difflib.get_close_matches(str(sub), GROUPS[key], n=1)
                hint = f"did you mean {near[0]!r}? " if near else ""
                raise ToolkitError(f"{source}: unknown key {key}.{sub}; {hint}allowed: {', '.join(GROUPS[key])}")
            out[f"{key}_{sub}"], spelled[f"{key}_{sub}"] = v, f"{key}.{sub}"
    return out
