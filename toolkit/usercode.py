"""The user's own code named by the config: `model: pkg.module:build`, `dataset: pkg.module:load`.

Before the colon, a module importable from PYTHONPATH (or the working folder) or a path to a .py
file; after it, the function. The contract (docs/API.md, "Your own model in the built-in script"):

- `build(config)` returns the framework's model (a torch `nn.Module`, a Keras 3 model, a Gluon
  block); it may branch on `config.framework`. An optional `loss(outputs, labels)` in the same
  module replaces cross-entropy (batches that are not `(x, y)`, in torch, Keras 3 and MXNet:
  `loss(outputs, batch)`, and without one the model's own loss; adapters/batches.py).
- `load(config)` returns `(train, eval)`: numpy `(x, y)` arrays, or the framework's datasets (torch
  `Dataset`, `tf.data.Dataset` of `(x, y)` samples, Gluon `Dataset`).

Anything that does not resolve is a one-line error naming the reference and what is wrong.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from toolkit.errors import ToolkitError


def resolve(key: str, reference: str):
    """The function `reference` names (the config's `key` gave it), or a one-line error."""
    where, _, name = reference.rpartition(":")
    module = _import(key, reference, where)
    function = getattr(module, name, None)
    if function is None:
        raise ToolkitError(f"{key}={reference!r}: {where} has no `{name}`; define `def {name}(config):` there "
                           "or fix the name after the colon")
    if not callable(function):
        raise ToolkitError(f"{key}={reference!r}: `{name}` in {where} is a {type(function).__name__}, not a function")
    return function


def companion(reference: str, name: str):
    """An optional object beside the referenced function (e.g. `loss` beside `build`), or None."""
    where = reference.rpartition(":")[0]
    return getattr(_import("model", reference, where), name, None)


def _import(key: str, reference: str, where: str):
    if where.endswith(".py") or os.sep in where:
        path = Path(where)
        if not path.is_file():
            raise ToolkitError(f"{key}={reference!r}: no file {where}; give a .py file or a module on PYTHONPATH "
                               "before the colon")
        name = f"toolkit_user_{path.stem}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)    # type: ignore[arg-type]  # a .py file: a spec
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)               # type: ignore[union-attr]  # with its loader
        except Exception as e:
            del sys.modules[name]
            raise ToolkitError(f"{key}={reference!r}: importing {where} failed ({e.__class__.__name__}: {e})") from None
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())        # a module in the working folder, as `python -m` finds it
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        if e.name and where.startswith(e.name):
            raise ToolkitError(f"{key}={reference!r}: no module named {e.name!r}; put its folder on PYTHONPATH, "
                               f"or give the .py file's path before the colon") from None
        raise ToolkitError(f"{key}={reference!r}: importing {where} failed ({e.__class__.__name__}: {e})") from None
    except Exception as e:
        raise ToolkitError(f"{key}={reference!r}: importing {where} failed ({e.__class__.__name__}: {e})") from None


def load_datasets(config):
    """`(train, eval)` from the user's `load(config)`, checked for shape."""
    out = resolve("dataset", config.dataset)(config)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ToolkitError(f"dataset={config.dataset!r}: load(config) must return (train, eval), got a "
                           f"{type(out).__name__}")
    return out
