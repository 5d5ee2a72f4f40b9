"""A user's own model, data and loss for the built-in script, in every framework (tests/test_api.py):

    python examples/train.py --framework torch --model tests/user_code.py:build --dataset tests/user_code.py:load

`build(config)` returns the framework's model (with a BatchNorm layer, whose statistics the ranks
must end up sharing); `load(config)` returns (train, eval) as the framework's own datasets; `loss`
replaces cross-entropy (here: cross-entropy with label smoothing, so it is really used).
"""
import numpy as np

FEATURES, CLASSES, SAMPLES = 16, 4, 512


def arrays(seed: int = 7):
    """A learnable problem: the label is the argmax of a fixed linear map of the inputs."""
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    y = np.argmax(x @ rng.standard_normal((FEATURES, CLASSES)), axis=1).astype(np.int64)
    return x, y


def build(config):
    if config.framework == "torch":
        import torch
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, CLASSES))
    if config.framework == "tensorflow":
        import keras
        return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32), keras.layers.BatchNormalization(),
                                 keras.layers.ReLU(), keras.layers.Dense(CLASSES)])
    from mxnet import gluon
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(32, in_units=FEATURES), gluon.nn.BatchNorm(in_channels=32), gluon.nn.Activation("relu"),
            gluon.nn.Dense(CLASSES, in_units=32))
    return net


def load(config):
    x, y = arrays()
    cut = SAMPLES * 3 // 4
    parts = ((x[:cut], y[:cut]), (x[cut:], y[cut:]))
    if config.framework == "torch":
        import torch
        return tuple(torch.utils.data.TensorDataset(torch.from_numpy(a), torch.from_numpy(b)) for a, b in parts)
    if config.framework == "tensorflow":
        import tensorflow as tf
        return tuple(tf.data.Dataset.from_tensor_slices((a, b)) for a, b in parts)
    from mxnet import gluon
    return tuple(gluon.data.ArrayDataset(a, b.astype(np.float32)) for a, b in parts)


def loss(outputs, labels):
    """Cross-entropy with label smoothing 0.1, written once per framework."""
    import importlib
    framework = type(outputs).__module__.split(".")[0]
    if framework == "torch":
        import torch.nn.functional as F
        return F.cross_entropy(outputs, labels, label_smoothing=0.1)
    if framework in ("tensorflow", "keras"):
        import tensorflow as tf
        onehot = tf.one_hot(tf.cast(labels, tf.int32), CLASSES) * 0.9 + 0.1 / CLASSES
        return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(onehot, outputs))
    mx = importlib.import_module("mxnet")
    logp = mx.nd.log_softmax(outputs)
    onehot = mx.nd.one_hot(labels, CLASSES) * 0.9 + 0.1 / CLASSES
    return -(onehot * logp).sum(axis=1)         # one value per sample, as Gluon's losses give


def not_a_model(config):
    """What a build() that returns the wrong thing looks like (for the error test)."""
    return {"weights": []}


def not_datasets(config):
    return [1, 2, 3]
