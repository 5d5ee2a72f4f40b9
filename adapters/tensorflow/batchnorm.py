"""sync_batchnorm for Keras 3: batch statistics over every rank's micro-batch.

Under TensorFlow's strategies Keras has its own: `BatchNormalization(synchronized=True)` all-reduces
the moments in the strategy's replica context, and `synchronize(model)` below turns it on. Under
Horovod there is no replica context (Keras's synchronized moments fall back to the local batch), and
Horovod's `hvd.SyncBatchNormalization` was written against tf.keras 2 (horovod#4290; the toolkit's
build patches it for Keras 3, row keras3-api), and this module keeps its own allreduce of sums so
that masks and accumulation work: Keras 3's layer gets the moments from one Horovod allreduce: each rank's per-channel sum, sum of squares and
count, added over the ranks (Horovod's allreduce has a gradient, so the backward pass is the union's
too). The layer's own code then normalises and updates its moving statistics as for one large batch.
"""
from __future__ import annotations

import keras
import tensorflow as tf


def _horovod_moments(self, inputs, mask):
    """Keras 3 BatchNormalization._moments over every Horovod rank's batch (no mask)."""
    if mask is not None or self._toolkit_hvd.size() == 1:
        return keras.layers.BatchNormalization._moments(self, inputs, mask)
    x = tf.cast(inputs, tf.float32)
    axes = list(self._reduction_axes)
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
    local = tf.concat([tf.reduce_sum(x, axes), tf.reduce_sum(x * x, axes), tf.reshape(count, [1])], 0)
    # unnamed: in a graph Horovod names it after the op, unique even when accumulation calls the
    # layer several times in one step, and the same on every rank (the same graph)
    total = self._toolkit_hvd.allreduce(local, op=self._toolkit_hvd.Sum)
    channels = (tf.shape(total)[0] - 1) // 2
    n = total[-1]
    mean = total[:channels] / n
    variance = tf.maximum(total[channels:2 * channels] / n - mean * mean, 0.0)
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)


class HorovodBatchNormalization(keras.layers.BatchNormalization):
    """A Keras 3 BatchNormalization whose batch moments are every rank's (see the module's text)."""
    _moments = _horovod_moments


def synchronize(model, hvd=None) -> int:
    """Every BatchNormalization of `model` synchronized across replicas: with `hvd`, over Horovod's
    ranks (the layer's class becomes HorovodBatchNormalization: no new state, the same variables);
    without, Keras's own `synchronized=True` for TensorFlow's strategies. Returns how many."""
    layers = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in layers:
        if hvd is None:
            layer.synchronized = True
        else:
            layer._toolkit_hvd = hvd
            layer.__class__ = HorovodBatchNormalization
    return len(layers)
