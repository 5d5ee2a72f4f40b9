"""Built-in models for PyTorch, chosen by the config's `model` key: users of `session.setup` like
any user's model."""
from __future__ import annotations

import torch

from toolkit.config import Model


def build(config, num_features: int, num_classes: int) -> torch.nn.Module:
    if config.model == Model.LINEAR.value:
        return torch.nn.Linear(num_features, num_classes)
    layers, width = [], num_features
    for _ in range(config.hidden_layers):
        layers += [torch.nn.Linear(width, config.hidden_size), torch.nn.ReLU()]
        width = config.hidden_size
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, num_classes))
