"""TensorFlow with legacy Keras 2 (the tf-keras package) through Horovod's own `horovod.tensorflow.keras`.

Horovod's Keras module does `from keras import backend` and `from tensorflow import keras`: on TF
>= 2.16 both are Keras 3 and it fails (horovod#4290). It works when `TF_USE_LEGACY_KERAS=1` is set
before TensorFlow is imported (so `tf.keras` is tf-keras) and `keras` is aliased to `tf_keras`
before Horovod's module is imported. This adapter does both, then uses Horovod's Keras pieces as
their authors meant: `hvd.DistributedOptimizer(backward_passes_per_step=k,
average_aggregated_gradients=True)` inside Keras's compiled `train_on_batch` (what `model.fit` runs).
Initialisation, evaluation, checkpoints and tensor ops are the Keras 3 adapter's (adapters/tensorflow.py).
"""
from __future__ import annotations

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"      # before tensorflow is imported below, so tf.keras is tf-keras

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from adapters.base import import_horovod  # noqa: E402
from adapters.tensorflow import TensorflowAdapter, make_optimizer  # noqa: E402
from toolkit.config import Compression, Config, Model, Op  # noqa: E402
from toolkit.errors import ToolkitError  # noqa: E402


def import_horovod_keras():
    """`horovod.tensorflow.keras`, made to import on TF 2.21: it must see tf-keras as `keras`."""
    if getattr(tf.keras, "__name__", "").split(".")[0] != "tf_keras":
        raise ToolkitError("keras=tf_keras: TensorFlow was imported before TF_USE_LEGACY_KERAS=1 was set, so "
                           "tf.keras is Keras 3; set TF_USE_LEGACY_KERAS=1 in the environment before starting")
    sys.modules["keras"] = tf_keras
    return import_horovod("horovod.tensorflow.keras", "tensorflow")


def build_model(config: Config, num_features: int, num_classes: int) -> tf_keras.Model:
    # Coupled L2, the meaning torch's and MXNet's weight_decay have: gradient + wd * w on every
    # weight. Keras's l2(c) adds c * sum(w^2) to the loss, whose gradient is 2c * w.
    reg = (lambda: tf_keras.regularizers.l2(config.weight_decay / 2)) if config.weight_decay else (lambda: None)
    dense = lambda units, **kw: tf_keras.layers.Dense(units, kernel_regularizer=reg(), bias_regularizer=reg(), **kw)
    layers = [tf_keras.Input((num_features,))]
    if config.model is Model.MLP:
        layers += [dense(config.hidden_size, activation="relu") for _ in range(config.hidden_layers)]
    return tf_keras.Sequential(layers + [dense(num_classes)])


class TfKerasAdapter(TensorflowAdapter):
    name = "tensorflow"
    path = "tf-keras through horovod.tensorflow.keras DistributedOptimizer"

    def init(self, config: Config, comm=None):
        topology = super().init(config, comm)
        self.hvd_keras = import_horovod_keras()
        return topology

    def build(self, config: Config, num_features: int, num_classes: int) -> None:
        tf_keras.utils.set_random_seed(config.seed + self.hvd.rank())
        self.model = build_model(config, num_features, num_classes)
        self.optimizer = make_optimizer(config, tf_keras)

    def wrap(self, config: Config) -> None:
        hvd = self.hvd_keras
        self.optimizer = hvd.DistributedOptimizer(
            self.optimizer,
            compression=hvd.Compression.fp16 if config.compression is Compression.FP16 else hvd.Compression.none,
            op={Op.AVERAGE: hvd.Average, Op.SUM: hvd.Sum, Op.ADASUM: self.hvd.Adasum}[config.op],
            backward_passes_per_step=config.accumulation_steps,
            average_aggregated_gradients=True)   # k micro-batch means -> their mean: the large batch
        self.optimizer.build(self.model.trainable_variables)   # state exists on every rank, for broadcast
        self.model.compile(optimizer=self.optimizer,
                           loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def broadcast(self, root: int = 0) -> None:
        self.hvd.broadcast_variables(self.model.variables + list(self.optimizer.variables), root_rank=root)

    def train_step(self, batches) -> float:
        # Horovod's optimizer aggregates locally and allreduces + applies on every k-th call.
        losses = [float(self.model.train_on_batch(x, y)) for x, y in batches]
        return sum(losses) / len(losses)
