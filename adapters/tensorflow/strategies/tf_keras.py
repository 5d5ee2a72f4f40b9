"""Legacy Keras 2 (the tf-keras package) on Horovod's own `horovod.tensorflow.keras`.

Horovod's Keras module does `from keras import backend` and `from tensorflow import keras`: on TF
>= 2.16 both are Keras 3 and it fails (horovod#4290). It works when `TF_USE_LEGACY_KERAS=1` is set
before TensorFlow is imported (adapters/tensorflow/tf_keras.py does) and `keras` is aliased to
`tf_keras` before Horovod's module is imported (`import_horovod_keras`). Then Horovod's Keras pieces
are used as their authors meant: `hvd.DistributedOptimizer(backward_passes_per_step=k,
average_aggregated_gradients=True)` inside Keras's compiled `train_on_batch` (what `model.fit` runs).
"""
from __future__ import annotations

import sys

import tensorflow as tf

from toolkit.adapters.horovod import import_horovod
from toolkit.adapters.tensorflow.strategies.horovod import TensorflowHorovod
from toolkit.adapters.topology import Topology
from toolkit.errors import ToolkitError


def import_horovod_keras():
    """`horovod.tensorflow.keras`, made to import on TF 2.21: it must see tf-keras as `keras`."""
    if getattr(tf.keras, "__name__", "").split(".")[0] != "tf_keras":
        raise ToolkitError("keras=tf_keras: TensorFlow was imported before TF_USE_LEGACY_KERAS=1 was set, so "
                           "tf.keras is Keras 3; set TF_USE_LEGACY_KERAS=1 in the environment before starting")
    import tf_keras
    sys.modules["keras"] = tf_keras
    return import_horovod("horovod.tensorflow.keras", "tensorflow")


class TfKerasHorovod(TensorflowHorovod):
    path = "tf-keras through horovod.tensorflow.keras DistributedOptimizer"

    def start(self, comm=None) -> Topology:
        topology = super().start(comm)
        self.hvd_keras = import_horovod_keras()
        return topology

    def distributed(self, optimizer, **options):
        """Horovod's DistributedOptimizer of `optimizer` (returned as it is when it is one already:
        wrapping it twice recursed without end in Horovod's __init__). Horovod copies the optimizer
        through get_config / from_config, which would rebuild a LearningRateSchedule by its
        registered name (a user's own schedule class: TypeError); the copy gets the schedule
        object itself (tf_keras's from_config passes a non-dict learning_rate through)."""
        if hasattr(optimizer, "_allreduce_grads"):       # what Horovod's __init__ gives its optimizers
            return optimizer
        import tf_keras

        from toolkit.adapters.tensorflow.keras import lr_schedule
        compression, op = self.reduction()
        schedule = lr_schedule(optimizer, tf_keras)
        if schedule is not None:
            optimizer.get_config = lambda: {**type(optimizer).get_config(optimizer), "learning_rate": schedule}
        try:
            return self.hvd_keras.DistributedOptimizer(optimizer, compression=compression, op=op, **options)
        finally:
            if schedule is not None:
                del optimizer.get_config

    def wrap(self, session) -> None:
        session.optimizer = self.distributed(
            session.optimizer, backward_passes_per_step=self.config.accumulation_steps,
            average_aggregated_gradients=True)   # k micro-batch means -> their mean: the large batch
        session.optimizer.build(session.model.trainable_variables)   # state exists on every rank, for broadcast
        session.model.compile(optimizer=session.optimizer, loss=lambda y, logits: session.loss_fn(logits, y))
        session.compile_steps(reduce=self.hvd.size() > 1 and not self.exchange)    # several models' step

    def broadcast(self, session, root: int = 0) -> None:
        self.hvd.broadcast_variables(session.model.variables + list(session.optimizer.variables), root_rank=root)

    # -- model.fit: Horovod's own tf-keras pieces ----------------------------------------------------------
    def fit_optimizer(self, session, optimizer):
        """Horovod's DistributedOptimizer of `optimizer` (the session's default is the config's); the one
        setup() returned is one already, and comes back as it is (fit then trains what the session saves)."""
        return self.distributed(optimizer)

    def fit_callbacks(self) -> list:
        import tf_keras

        from toolkit.adapters.tensorflow import fit
        hvd = self.hvd_keras
        return [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                fit.StatisticsCallback(self, tf_keras)]
