"""Built-in models for MXNet Gluon, chosen by the config's `model` key: users of `session.setup`
like any user's model."""
from __future__ import annotations

from mxnet import gluon


def build(config, num_features: int, num_classes: int) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    width = num_features
    if config.model == "mlp":
        for _ in range(config.hidden_layers):
            net.add(gluon.nn.Dense(config.hidden_size, activation="relu", in_units=width))
            width = config.hidden_size
    net.add(gluon.nn.Dense(num_classes, in_units=width))
    return net
