"""Framework name -> adapter class, imported only when chosen, so `import toolkit` stays light.

Availability is decided here, once, from `importlib.util.find_spec` (no framework import).
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class AdapterSpec:
    target: str                 # "module:Class"
    package: str                # the framework's importable top-level package
    install: str                # what to tell a user who lacks it
    backends: tuple[str, ...]   # Config.backend values the adapter implements
    ops: tuple[str, ...] = ("average", "sum", "adasum")   # Config.op values it implements
    missing_ops_reason: str = ""


_ADAPTERS: dict[str, AdapterSpec] = {
    "torch": AdapterSpec("adapters.torch:TorchAdapter", "torch",
                         "pip install torch==2.13.0 (or run `make setup`)", ("horovod",)),
    "tensorflow": AdapterSpec("adapters.tensorflow:TensorflowAdapter", "tensorflow",
                              "pip install tensorflow-cpu==2.21.0 (or run `make setup`)", ("horovod",)),
    "mxnet": AdapterSpec("adapters.mxnet:MxnetAdapter", "mxnet",
                         "pip install mxnet==1.9.1 numpy==1.26.4 (or run `make setup`)", ("horovod",),
                         ops=("average", "sum"),
                         missing_ops_reason="Horovod's MXNet DistributedTrainer has no Adasum"),
}


def names() -> list[str]:
    return list(_ADAPTERS)


def spec(name: str) -> AdapterSpec:
    try:
        return _ADAPTERS[name]
    except KeyError:
        raise ToolkitError(f"framework={name!r} not found. Available: {', '.join(_ADAPTERS)}") from None


def is_available(name: str) -> bool:
    return importlib.util.find_spec(spec(name).package) is not None


def load(name: str):
    """The adapter class for `name`; a clear error if the framework is missing."""
    s = spec(name)
    if not is_available(name):
        raise ToolkitError(f"framework={name!r} is not installed in this Python; {s.install}")
    module_name, _, cls = s.target.partition(":")
    return getattr(importlib.import_module(module_name), cls)
