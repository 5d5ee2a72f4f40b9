"""Built-in models for Keras 3 (and, through `keras_module`, the MLP for legacy tf-keras), chosen by
the config's `model` key: users of `session.setup` like any user's model. ResNet-50 is
keras.applications' (weights=None); keras.applications has no ResNet-18, so it is built here from
Keras layers in torchvision's shape; the language model is built from Keras's own layers."""
from __future__ import annotations

import keras

from toolkit.config import Model


def build(config, num_features: int, num_classes: int, keras_module=keras, regularizer=None, input_shape=None):
    """The config's model; `regularizer()` makes each MLP layer's kernel and bias regularizer
    (tf-keras's coupled L2)."""
    if config.model == Model.RESNET50.value:
        return keras.applications.ResNet50(weights=None, input_shape=input_shape, classes=num_classes,
                                           classifier_activation=None)
    if config.model == Model.RESNET18.value:
        return resnet18(input_shape, num_classes)
    if config.model == Model.TRANSFORMER_LM.value:
        return transformer_lm(num_classes, config.hidden_size, config.hidden_layers, config.heads, config.context)
    reg = regularizer or (lambda: None)

    def dense(units, **kw):
        return keras_module.layers.Dense(units, kernel_regularizer=reg(), bias_regularizer=reg(), **kw)

    layers = [keras_module.Input((num_features,))]
    if config.model == "mlp":
        layers += [dense(config.hidden_size, activation="relu") for _ in range(config.hidden_layers)]
    return keras_module.Sequential(layers + [dense(num_classes)])


# -- ResNet-18 in torchvision's shape (padding explicit, as torch pads; BatchNorm's momentum and epsilon as torch's) --

def _bn(x):
    return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)


def _conv(x, filters: int, kernel: int, stride: int):
    pad = kernel // 2
    if pad:
        x = keras.layers.ZeroPadding2D(pad)(x)
    return keras.layers.Conv2D(filters, kernel, stride, use_bias=False)(x)


def _basic_block(x, filters: int, stride: int):
    shortcut = x
    y = keras.layers.ReLU()(_bn(_conv(x, filters, 3, stride)))
    y = _bn(_conv(y, filters, 3, 1))
    if stride != 1 or x.shape[-1] != filters:
        shortcut = _bn(_conv(x, filters, 1, stride))
    return keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))


def resnet18(input_shape, num_classes: int) -> keras.Model:
    inputs = keras.Input(input_shape)
    x = keras.layers.ReLU()(_bn(_conv(inputs, 64, 7, 2)))
    x = keras.layers.MaxPooling2D(3, 2)(keras.layers.ZeroPadding2D(1)(x))
    for i, filters in enumerate((64, 128, 256, 512)):
        for j in range(2):
            x = _basic_block(x, filters, 2 if i and not j else 1)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="resnet18")


# -- a decoder-only language model --------------------------------------------------------------------------

class Positions(keras.layers.Layer):
    """Learned position embeddings added to the token embeddings (the first T of `context`)."""

    def __init__(self, context: int, width: int, **kw):
        super().__init__(**kw)
        self.context, self.width = context, width

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.context, self.width), initializer="random_normal", name="table")

    def call(self, x):
        return x + keras.ops.cast(self.table[: keras.ops.shape(x)[1]], x.dtype)


def transformer_lm(vocab: int, width: int, depth: int, heads: int, context: int) -> keras.Model:
    """GPT's shape, as adapters/torch/models.py's TransformerLM: pre-norm blocks of causal
    self-attention and a 4x GELU MLP, a final LayerNorm, logits [batch, T, vocab]."""
    ids = keras.Input((context,), dtype="int32")
    h = Positions(context, width)(keras.layers.Embedding(vocab, width)(ids))
    for _ in range(depth):
        a = keras.layers.LayerNormalization(epsilon=1e-5)(h)
        a = keras.layers.MultiHeadAttention(heads, width // heads)(a, a, use_causal_mask=True)
        h = keras.layers.Add()([h, a])
        m = keras.layers.LayerNormalization(epsilon=1e-5)(h)
        m = keras.layers.Dense(width)(keras.layers.Dense(4 * width, activation="gelu")(m))
        h = keras.layers.Add()([h, m])
    logits = keras.layers.Dense(vocab)(keras.layers.LayerNormalization(epsilon=1e-5)(h))
    return keras.Model(ids, logits, name="transformer_lm")
