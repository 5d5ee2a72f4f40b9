"""Built-in models for PyTorch, chosen by the config's `model` key: users of `session.setup` like
any user's model. The ResNets are torchvision's (weights=None); the language model is written here
from torch's own layers (torchvision has none)."""
from __future__ import annotations

import torch

from toolkit.config import Model


def build(config, num_features: int, num_classes: int, input_shape=None) -> torch.nn.Module:
    if config.model in (Model.RESNET18.value, Model.RESNET50.value):
        import torchvision
        return getattr(torchvision.models, config.model)(weights=None, num_classes=num_classes)
    if config.model == Model.TRANSFORMER_LM.value:
        return TransformerLM(num_classes, config.hidden_size, config.hidden_layers, config.heads, config.context)
    if config.model == Model.LINEAR.value:
        return torch.nn.Linear(num_features, num_classes)
    layers, width = [], num_features
    for _ in range(config.hidden_layers):
        layers += [torch.nn.Linear(width, config.hidden_size), torch.nn.ReLU()]
        width = config.hidden_size
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, num_classes))


class TransformerLM(torch.nn.Module):
    """A decoder-only language model (GPT's shape): token and learned position embeddings, `depth`
    pre-norm blocks of causal self-attention and a 4x MLP, a final LayerNorm, logits over `vocab`.
    Input: token ids [batch, T <= context]; output: logits [batch, T, vocab]."""

    def __init__(self, vocab: int, width: int, depth: int, heads: int, context: int):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        block = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(block, depth, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))
