"""Built-in models for Keras 3 (and, through `keras_module`, for legacy tf-keras), chosen by the
config's `model` key: users of `session.setup` like any user's model."""
from __future__ import annotations

import keras


def build(config, num_features: int, num_classes: int, keras_module=keras, regularizer=None):
    """The MLP (or, with `model: linear`, one dense layer); `regularizer()` makes each layer's
    kernel and bias regularizer (tf-keras's coupled L2)."""
    reg = regularizer or (lambda: None)
    dense = lambda units, **kw: keras_module.layers.Dense(units, kernel_regularizer=reg(), bias_regularizer=reg(), **kw)
    layers = [keras_module.Input((num_features,))]
    if config.model == "mlp":
        layers += [dense(config.hidden_size, activation="relu") for _ in range(config.hidden_layers)]
    return keras_module.Sequential(layers + [dense(num_classes)])
