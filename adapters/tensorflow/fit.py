"""Keras 3 `model.fit` on Horovod: what `horovod.tensorflow.keras` gives tf-keras users (it fails on
Keras 3, horovod#4290), for Keras 3. A session hands them out configured (`session.fit_optimizer`,
`session.fit_callbacks`); examples/keras_fit.py shows both Keras 3 and tf-keras.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from toolkit.adapters.horovod import import_horovod
from toolkit.adapters.tensorflow.strategies.horovod import allreduce_gradients


def _hvd():
    return import_horovod("horovod.tensorflow", "tensorflow")


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, op=None,
                         compression=None) -> keras.optimizers.Optimizer:
    """A copy of a Keras 3 optimizer that allreduces gradients before applying them.

    For `model.fit` and custom loops alike (both end in `optimizer.apply`). With Keras's own
    `gradient_accumulation_steps`, each micro-batch's gradients are allreduced (the result equals
    the large batch; the toolkit's trainer instead allreduces once per step).
    """
    hvd = _hvd()
    op = hvd.Average if op is None else op
    compression = hvd.Compression.none if compression is None else compression

    class _Distributed(type(optimizer)):
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            if hvd.size() > 1:
                grads = allreduce_gradients(hvd, grads, op, compression)
            return super().apply(grads, trainable_variables)

    _Distributed.__name__ = f"Distributed{type(optimizer).__name__}"
    return _Distributed.from_config(optimizer.get_config())


class BroadcastCallback(keras.callbacks.Callback):
    """At the start of `fit`: rank 0's model and optimizer variables on every rank."""

    def on_train_begin(self, logs=None):
        hvd = _hvd()
        if not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        for i, v in enumerate(self.model.variables + list(self.model.optimizer.variables)):
            v.assign(hvd.broadcast(v.value, root_rank=0, name=f"toolkit.fit_broadcast.{i}"))


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end: every logged metric averaged over the ranks (so rank 0 logs the job's)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs:
            hvd = _hvd()
            for key in sorted(logs):
                logs[key] = float(hvd.allreduce(tf.constant(float(logs[key]), tf.float64),
                                                op=hvd.Average, name=f"toolkit.metric.{key}"))
