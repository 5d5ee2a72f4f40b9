"""What every caller does before it trains, whoever it is (a user's script through `toolkit.start`,
the built-in trainer, the parameter server's workers, `toolkit bench`): start the framework's
session, make the model (the user's `build(config)` or a built-in one) and set it up, make the
loaders. The verbs themselves are the session's (adapters/base.py, docs/API.md).
"""
from __future__ import annotations

from toolkit import registry, usercode
from toolkit.config import Config, is_reference
from toolkit.data import datasets
from toolkit.errors import ToolkitError


def start(config: Config, comm=None):
    """The framework's session for `config` on its strategy, started (hvd.init, device, threads, seeds)."""
    session_cls, strategy_cls = registry.load(config.framework, config.backend.value, config.keras.value)
    return session_cls.start(config, strategy_cls(config), comm)


def build_model(config: Config, session, data: datasets.Datasets):
    """(model, loss): the user's `build(config)` (and `loss` beside it), or the built-in model."""
    if is_reference(config.model):
        build = usercode.resolve("model", config.model)
        with session.scope():
            model = build(config)
        return model, usercode.companion(config.model, "loss")
    if data.num_features is None or data.num_classes is None:
        raise ToolkitError(f"model={config.model} needs the number of input features and classes: give numpy (x, y) "
                           "arrays with integer labels, a dataset with a `num_classes` attribute and numpy inputs, "
                           "or your own model (model: pkg.module:build)")
    with session.scope():
        return session.builtin_model(data.num_features, data.num_classes, data.input_shape), None


def setup(config: Config, session, data: datasets.Datasets):
    """The model set up on the session; a user's build() that returned something else is named."""
    model, loss = build_model(config, session, data)
    try:
        return session.setup(model, loss=loss)
    except ToolkitError as e:
        if is_reference(config.model):
            raise ToolkitError(f"model={config.model!r}: build(config) returned a {type(model).__name__}; {e}") from None
        raise


def loaders(config: Config, session, data: datasets.Datasets):
    """(train, eval) loaders; a user's load() that returned something else is named."""
    try:
        return session.loader(data.train), session.loader(data.eval, train=False)
    except ToolkitError as e:
        if is_reference(config.dataset):
            raise ToolkitError(f"dataset={config.dataset!r}: {e}") from None
        raise
