"""TensorFlow's own strategies (adapters/tensorflow/strategies/native.py), the session's tensor work:
each replica's model, made inside the strategy's scope, starts from its own weights (seed + replica),
the built-in step (`train_step`) runs per replica inside the strategy. A user's model must be made
inside `session.scope()` (the strategy's scope), as TensorFlow asks. A user's own loop
(`backward(loss, tape)`, `step()`, several models) is the Horovod session's (session.py), its reduce
the strategy's collective over the processes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from toolkit.adapters.parts import part_own
from toolkit.adapters.tensorflow import models
from toolkit.adapters.tensorflow.session import TensorflowSession
from toolkit.adapters.topology import digest
from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.adapters.tensorflow.strategies.native import TensorflowNative


class NativeSession(TensorflowSession):
    strategy: TensorflowNative
    _native_step = part_own("native_step")     # the built-in step inside the strategy, per model (strategy's)

    # -- model ------------------------------------------------------------------------------------
    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        self._builtin = (num_features, num_classes, input_shape)     # setup() gives each replica its own start
        return models.build(self.config, num_features, num_classes, input_shape=input_shape)

    def _place(self, model):
        model = super()._place(model)
        if not any(isinstance(v.value, tf.distribute.DistributedValues) for v in model.weights) \
                and self.strategy.tf.num_replicas_in_sync > 1:
            raise ToolkitError("backend=native: create the model inside session.scope() (`with session.scope(): "
                               "model = build()`), so TensorFlow's strategy mirrors its variables")
        return model

    def _make_optimizer(self, model):
        with self.strategy.scope():
            return super()._make_optimizer(model)

    def start_replicas_apart(self) -> None:
        """Replica r starts from the weights seed + r gives, as Horovod rank r does: different on
        purpose, so the broadcast that follows is really exercised (and tested). (A user's model
        made once in the scope starts the same on every replica: TensorFlow mirrors it.)"""
        if not getattr(self, "_builtin", None):
            return
        num_features, num_classes, input_shape = self._builtin
        first = self.rank * self.replicas
        initial = []
        for r in range(first, first + self.replicas):
            keras.utils.set_random_seed(self.config.seed + r)
            initial.append(models.build(self.config, num_features, num_classes, input_shape=input_shape).get_weights())
        for i, v in enumerate(self.model.weights):
            values = self.strategy.tf.experimental_distribute_values_from_function(
                lambda ctx, i=i: tf.constant(initial[ctx.replica_id_in_sync_group - first][i]))
            self.strategy.tf.extended.update(v.value, lambda var, value: var.assign(value), args=(values,), group=False)
        self.local_digests = [digest(p) for p in self.replica_parameters()]

    def _train_step(self, batches) -> float:
        return self.strategy.train_step(self, batches)

    def local_gradients(self, batches=None):
        raise ToolkitError("backend=native (tensorflow) has no toolkit exchange: compression bf16/int8/topk/"
                           "powersgd, local SGD and the parameter server run on backend: horovod; or use "
                           "compression: none")

    def set_lr(self, lr: float) -> None:
        self._refuse_schedule()
        self.optimizer.learning_rate.assign(lr) if hasattr(self.optimizer.learning_rate, "assign") \
            else setattr(self.optimizer, "learning_rate", lr)

    def _buffers(self) -> list:
        """Each statistic (BatchNorm's moving mean and variance: Keras 3 keeps a copy per replica, each
        updated by its replica's batches) averaged over this process's replicas; sync_buffers averages
        that over the ranks and assigns it to every replica."""
        return [np.mean([np.asarray(x) for x in self.strategy.tf.experimental_local_results(v.value)], axis=0)
                for v in self._statistics()]

    def replica_parameters(self) -> list[list]:
        """Each replica's copy of every model's weights, in setup order."""
        per_variable = [self.strategy.tf.experimental_local_results(v.value)
                        for part in (self.parts or [self.part]) for v in part.model.weights]
        return [[np.asarray(values[r]) for values in per_variable] for r in range(self.replicas)]

