"""What the config's rules share: the elastic keys and the one-line message for a key's bad value."""
from __future__ import annotations

from .groups import ELASTIC_KEYS, flag
from .values import ConfigError

# The elastic keys, each of which turns elastic training on.
ELASTIC = tuple(f"elastic_{k}" for k in ELASTIC_KEYS)


def bad(name: str, value, why: str, example: str) -> None:
    raise ConfigError(f"{name}={value!r} {why}; e.g. {flag(name)} {example} or `{name}: {example}` in YAML", name)
