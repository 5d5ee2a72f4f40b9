"""TensorFlow with legacy Keras 2 (the tf-keras package) through Horovod's own `horovod.tensorflow.keras`.

Horovod's Keras module does `from keras import backend` and `from tensorflow import keras`: on TF
>= 2.16 both are Keras 3 and it fails (horovod#4290). It works when `TF_USE_LEGACY_KERAS=1` is set
before TensorFlow is imported (so `tf.keras` is tf-keras) and `keras` is aliased to `tf_keras`
before Horovod's module is imported. This session does both, then uses Horovod's Keras pieces as
their authors meant: `hvd.DistributedOptimizer(backward_passes_per_step=k,
average_aggregated_gradients=True)` inside Keras's compiled `train_on_batch` (what `model.fit` runs);
a user's own loop calls `backward(loss, tape)`, which hands each micro-batch's gradients to that
optimizer (it aggregates k of them, then allreduces and applies). Starting, data, evaluation,
checkpoints and tensor ops are the Keras 3 session's (session.py).
"""
from __future__ import annotations

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"      # before tensorflow is imported below, so tf.keras is tf-keras

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from toolkit.adapters.horovod import import_horovod, reduction  # noqa: E402
from toolkit.adapters.tensorflow import models  # noqa: E402
from toolkit.adapters.tensorflow.session import TensorflowSession  # noqa: E402
from toolkit.errors import ToolkitError  # noqa: E402


def import_horovod_keras():
    """`horovod.tensorflow.keras`, made to import on TF 2.21: it must see tf-keras as `keras`."""
    if getattr(tf.keras, "__name__", "").split(".")[0] != "tf_keras":
        raise ToolkitError("keras=tf_keras: TensorFlow was imported before TF_USE_LEGACY_KERAS=1 was set, so "
                           "tf.keras is Keras 3; set TF_USE_LEGACY_KERAS=1 in the environment before starting")
    sys.modules["keras"] = tf_keras
    return import_horovod("horovod.tensorflow.keras", "tensorflow")


def build_model(config, num_features: int, num_classes: int) -> tf_keras.Model:
    # Coupled L2, the meaning torch's and MXNet's weight_decay have: gradient + wd * w on every
    # weight. Keras's l2(c) adds c * sum(w^2) to the loss, whose gradient is 2c * w.
    reg = (lambda: tf_keras.regularizers.l2(config.weight_decay / 2)) if config.weight_decay else None
    return models.build(config, num_features, num_classes, keras_module=tf_keras, regularizer=reg)


class TfKerasSession(TensorflowSession):
    name = "tensorflow"
    path = "tf-keras through horovod.tensorflow.keras DistributedOptimizer"
    keras = tf_keras

    def _start(self, comm=None):
        topology = super()._start(comm)
        self.hvd_keras = import_horovod_keras()
        return topology

    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        return build_model(self.config, num_features, num_classes)

    def _cross_entropy(self, logits, labels):
        return tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(labels, tf.cast(logits, tf.float32),
                                                                              from_logits=True))

    def _with_weight_decay(self, grads):
        return grads        # tf-keras: the L2 regularizers of the model's layers (build_model)

    def _wrap(self) -> None:
        compression, op = reduction(self.hvd, self.config)
        self.optimizer = self.hvd_keras.DistributedOptimizer(
            self.optimizer, compression=compression, op=op, backward_passes_per_step=self.config.accumulation_steps,
            average_aggregated_gradients=True)   # k micro-batch means -> their mean: the large batch
        self.optimizer.build(self.model.trainable_variables)   # state exists on every rank, for broadcast
        self.model.compile(optimizer=self.optimizer, loss=lambda y, logits: self.loss_fn(logits, y))

    def broadcast(self, root: int = 0) -> None:
        self.hvd.broadcast_variables(self.model.variables + list(self.optimizer.variables), root_rank=root)

    def _train_step(self, batches):
        # Horovod's optimizer aggregates locally and allreduces + applies on every k-th call.
        losses = [float(self.model.train_on_batch(x, y)) for x, y in batches]
        return sum(losses) / len(losses)

    def backward(self, loss, tape=None) -> None:
        if tape is None:
            raise ToolkitError("TensorFlow computes gradients from a tape: compute the loss under "
                               "`with tf.GradientTape() as tape:` and call session.backward(loss, tape)")
        variables = self.model.trainable_variables
        grads = tape.gradient(loss + sum(self.model.losses), variables)   # the layers' L2 terms too
        self.optimizer.apply_gradients(zip(grads, variables))            # aggregated k times by Horovod
        self.micro += 1

    def _apply_step(self) -> None:
        pass                # the k-th backward() applied it (Horovod's backward_passes_per_step)

    # -- model.fit: Horovod's own tf-keras pieces ----------------------------------------------------------
    def fit_optimizer(self, optimizer=None):
        from toolkit.adapters.tensorflow.keras import make_optimizer
        compression, op = reduction(self.hvd, self.config)
        return self.hvd_keras.DistributedOptimizer(optimizer or make_optimizer(self.config, tf_keras),
                                                   compression=compression, op=op)

    def fit_callbacks(self) -> list:
        hvd = self.hvd_keras
        return [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
