"""Keras 3 `model.fit` on Horovod: what `horovod.tensorflow.keras` gives tf-keras users (it fails on
Keras 3, horovod#4290), for Keras 3. A session hands them out configured (`session.fit_optimizer`,
`session.fit_callbacks`); examples/keras_fit.py shows both Keras 3 and tf-keras. The moving
statistics' average at each epoch's end (`StatisticsCallback`) serves tf-keras too: Horovod has none.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from toolkit.adapters.horovod import allreduce_gradients, import_horovod
from toolkit.adapters.tensorflow.keras import statistics
from toolkit.exchange.arrays import flatten, unflatten


def _hvd():
    return import_horovod("horovod.tensorflow", "tensorflow")


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, op=None,
                         compression=None) -> keras.optimizers.Optimizer:
    """`optimizer` itself, made to allreduce its gradients before applying them.

    For `model.fit` and custom loops alike (both end in `optimizer.apply`). The same object, its
    class swapped for a subclass whose `apply` allreduces first. A copy through get_config /
    from_config (Horovod's way) rebuilds a LearningRateSchedule by its registered name, so a user's
    own schedule class fails with a TypeError, and starts from step 0 with fresh slots, so the
    optimizer `session.setup` set up, broadcast and checkpoints (or loaded, with its iteration
    count) would not be the one fit trains. Converting it again returns it
    unchanged (its gradients would be allreduced twice). With Keras's own
    `gradient_accumulation_steps`, each micro-batch's gradients are allreduced (the result equals
    the large batch; the toolkit's trainer instead allreduces once per step).
    """
    if isinstance(optimizer, _Allreducing):
        return optimizer
    hvd = _hvd()
    op = hvd.Average if op is None else op
    compression = hvd.Compression.none if compression is None else compression

    class _Distributed(_Allreducing, type(optimizer)):     # type: ignore[misc]  # the user's optimizer class
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            if hvd.size() > 1:
                grads = allreduce_gradients(hvd, grads, op, compression)
            return super().apply(grads, trainable_variables)

    _Distributed.__name__ = f"Distributed{type(optimizer).__name__}"
    optimizer.__class__ = _Distributed
    return optimizer


class _Allreducing:
    """Marks an optimizer DistributedOptimizer converted."""


class BroadcastCallback(keras.callbacks.Callback):
    """At the start of `fit`: rank 0's model and optimizer variables on every rank."""

    def on_train_begin(self, logs=None):
        hvd = _hvd()
        if not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        for i, v in enumerate(self.model.variables + list(self.model.optimizer.variables)):
            v.assign(hvd.broadcast(v.value, root_rank=0, name=f"toolkit.fit_broadcast.{i}"))


def average_statistics(model, strategy) -> None:
    """`model`'s moving statistics (BatchNormalization's) averaged over the ranks: what the
    facade's `sync_buffers` does for the session's model, for a model `fit` trains."""
    variables = statistics(model)
    if not variables or strategy.hvd.size() == 1:
        return
    arrays = [v.numpy() for v in variables]
    flat = strategy.allreduce(flatten(arrays), average=True, name="toolkit.fit_statistics")
    for v, a in zip(variables, unflatten(flat, arrays)):
        v.assign(a)


def StatisticsCallback(strategy, keras_module=keras):
    """A `keras_module` callback (Keras 3 or tf_keras) that averages the moving statistics over the
    ranks at each epoch's end.

    Each rank's BatchNormalization updates its moving mean and variance from its own batches, and
    allreduced gradients do not touch them: without this, `model.get_weights()` differed by rank
    after fit. The average, not rank 0's: it is what `sync_buffers` (the toolkit's own loop,
    evaluate, save, check_replicas) does, and the moving mean is linear in the batch means, so from
    equal values at the epoch's start, the average is exactly the moving mean of every rank's
    batches (the variance: the mean of the ranks' batch variances); rank 0's would keep half the
    data's. (With sync_batchnorm the statistics are equal already, and their average is the same.)
    """

    class AverageStatisticsCallback(keras_module.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            average_statistics(self.model, strategy)

    return AverageStatisticsCallback()


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end: every logged metric averaged over the ranks (so rank 0 logs the job's)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs:
            hvd = _hvd()
            for key in sorted(logs):
                logs[key] = float(hvd.allreduce(tf.constant(float(logs[key]), tf.float64),
                                                op=hvd.Average, name=f"toolkit.metric.{key}"))
