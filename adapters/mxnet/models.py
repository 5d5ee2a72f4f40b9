"""Built-in models for MXNet Gluon, chosen by the config's `model` key: users of `session.setup`
like any user's model. The ResNets are Gluon's model zoo's (mxnet.gluon.model_zoo.vision, v1, no
pretrained weights); their shapes are inferred by one forward pass on a zero batch here, so the
session receives initialised parameters. (transformer_lm is refused for MXNet in toolkit/registry.py.)"""
from __future__ import annotations

import mxnet as mx
from mxnet import gluon

from toolkit.config import Model


def build(config, num_features: int, num_classes: int, input_shape=None) -> gluon.Block:
    if config.model in (Model.RESNET18.value, Model.RESNET50.value):
        net = getattr(gluon.model_zoo.vision, f"{config.model}_v1")(classes=num_classes)
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros((1, *input_shape)))      # Gluon's deferred shapes, known from here on
        net.hybridize()                           # one graph, as Horovod's MXNet ResNet-50 example runs it
        return net
    net = gluon.nn.HybridSequential()
    width = num_features
    if config.model == "mlp":
        for _ in range(config.hidden_layers):
            net.add(gluon.nn.Dense(config.hidden_size, activation="relu", in_units=width))
            width = config.hidden_size
    net.add(gluon.nn.Dense(num_classes, in_units=width))
    return net
