"""TensorFlow 2.21 + Keras 3 through Horovod's TensorFlow ops.

`horovod.tensorflow.keras` fails on Keras 3 (horovod#4290), so this adapter is the toolkit's own
Keras 3 integration on top of `horovod.tensorflow`: a custom training step that computes the
local gradients of `accumulation_steps` micro-batches, allreduces them once
(`hvd.grouped_allreduce` with the configured compression and op), adds coupled L2 weight decay
(the same meaning as torch's and MXNet's `weight_decay`) and applies them. With the toolkit's
exchange (compression bf16/int8/topk, local SGD) the allreduce is left out and
toolkit/communication.py moves the gradients through `local_gradients` / `apply_gradients`.
"""
from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from adapters.base import (Adapter, Topology, import_horovod, require_gpu_if_asked, start_horovod,
                           threads_per_rank)
from toolkit.config import Compression, Config, Model, Op, Optimizer

WEIGHTS_FILE = "weights.npz"
OPTIMIZER_FILE = "optimizer.npz"


def build_model(config: Config, num_features: int, num_classes: int) -> keras.Model:
    layers = [keras.Input((num_features,))]
    if config.model is Model.MLP:
        layers += [keras.layers.Dense(config.hidden_size, activation="relu") for _ in range(config.hidden_layers)]
    return keras.Sequential(layers + [keras.layers.Dense(num_classes)])


def set_threads(threads: int) -> None:
    """TensorFlow's op thread pools (before its runtime starts)."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def make_optimizer(config: Config, keras_module=keras):
    """The configured optimizer from `keras_module` (Keras 3, or tf_keras for the legacy path)."""
    if config.optimizer is Optimizer.SGD:
        return keras_module.optimizers.SGD(learning_rate=config.lr, momentum=config.momentum)
    return keras_module.optimizers.Adam(learning_rate=config.lr)


def _save_arrays(path: Path, arrays) -> None:
    with open(path, "wb") as f:      # a file object: np.savez would append .npz to a bare name
        np.savez(f, *arrays)


def _load_arrays(path: Path) -> list:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


# -- Keras 3 `model.fit` with Horovod: what horovod.tensorflow.keras gives tf-keras users ----------

def _hvd():
    return import_horovod("horovod.tensorflow", "tensorflow")


def allreduce_gradients(hvd, grads, op, compression) -> list:
    """One grouped allreduce of the gradients; per tensor for Adasum, whose grouped form fails in
    Horovod 0.28.1 (`UnboundLocalError: 'tensor'` in horovod/tensorflow/__init__.py's Adasum branch
    of grouped_allreduce: the name only exists inside a list comprehension)."""
    if op == hvd.Adasum:
        return [hvd.allreduce(g, op=op, compression=compression) for g in grads]
    return hvd.grouped_allreduce(grads, op=op, compression=compression)


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


class TensorflowAdapter(Adapter):
    name = "tensorflow"
    path = "Keras 3 step on horovod.tensorflow grouped_allreduce"

    def init(self, config: Config, comm=None) -> Topology:
        set_threads(threads_per_rank())
        self.hvd = hvd = start_horovod(config, "horovod.tensorflow", "tensorflow", comm=comm)
        gpus = tf.config.list_physical_devices("GPU")
        require_gpu_if_asked(bool(gpus))
        if gpus:   # one GPU per local rank, the Horovod pattern
            gpu = gpus[hvd.local_rank() % len(gpus)]
            tf.config.experimental.set_memory_growth(gpu, True)
            tf.config.set_visible_devices(gpu, "GPU")
        device = f"gpu:{hvd.local_rank()}" if gpus else "cpu"
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), device)

    def build(self, config: Config, num_features: int, num_classes: int) -> None:
        keras.utils.set_random_seed(config.seed + self.hvd.rank())
        self.model = build_model(config, num_features, num_classes)
        self.optimizer = make_optimizer(config)
        self.optimizer.build(self.model.trainable_variables)   # state exists on every rank, for broadcast
        self.weight_decay = config.weight_decay
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def wrap(self, config: Config) -> None:
        hvd = self.hvd
        compression = hvd.Compression.fp16 if config.compression is Compression.FP16 else hvd.Compression.none
        op = {Op.AVERAGE: hvd.Average, Op.SUM: hvd.Sum, Op.ADASUM: hvd.Adasum}[config.op]
        variables = self.model.trainable_variables
        weight_decay = self.weight_decay
        reduce = hvd.size() > 1 and not config.toolkit_exchange

        def summed_gradients(batches):
            """Mean loss and gradients over the micro-batches (a tuple of (x, y): unrolled in the graph)."""
            total, summed = 0.0, None
            for x, y in batches:
                with tf.GradientTape() as tape:
                    loss = self.loss_fn(y, self.model(x, training=True)) / len(batches)
                grads = tape.gradient(loss, [v.value for v in variables])
                summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
                total += loss
            return total, summed

        def apply(grads):
            if reduce:
                grads = allreduce_gradients(hvd, grads, op, compression)
            if weight_decay:
                grads = [g + weight_decay * v.value for g, v in zip(grads, variables)]
            self.optimizer.apply_gradients(zip(grads, variables))

        def step(batches):
            loss, grads = summed_gradients(batches)
            apply(grads)
            return loss

        # One graph call per optimizer step (gradients, allreduce and update together, as Horovod's
        # own TF2 examples do); traced once per micro-batch count and shape.
        self._step, self._local_gradients, self._apply = (tf.function(step), tf.function(summed_gradients),
                                                          tf.function(apply))

    def broadcast(self, root: int = 0) -> None:
        hvd = self.hvd
        for i, v in enumerate(self.model.variables + list(self.optimizer.variables)):
            v.assign(hvd.broadcast(v.value, root_rank=root, name=f"toolkit.broadcast.{i}"))

    def set_lr(self, lr: float) -> None:
        self.optimizer.learning_rate = lr

    @staticmethod
    def _tensors(batches) -> tuple:
        return tuple((tf.constant(x), tf.constant(y)) for x, y in batches)

    def train_step(self, batches) -> float:
        return float(self._step(self._tensors(batches)))

    def local_gradients(self, batches):
        loss, grads = self._local_gradients(self._tensors(batches))
        return float(loss), [g.numpy() for g in grads]

    def apply_gradients(self, grads) -> None:
        self._apply([tf.constant(g) for g in grads])

    def weights(self) -> list:
        return [v.numpy() for v in self.model.trainable_variables]

    def set_weights(self, arrays) -> None:
        for v, a in zip(self.model.trainable_variables, arrays, strict=True):
            v.assign(a)

    def _state_variables(self) -> list:
        slots = [v for v in self.optimizer.variables
                 if v.dtype.startswith("float") and not v.path.endswith(("/iteration", "/learning_rate"))]
        return list(self.model.trainable_variables) + slots

    def get_state(self) -> list:
        return [v.numpy() for v in self._state_variables()]

    def set_state(self, arrays) -> None:
        for v, a in zip(self._state_variables(), arrays, strict=True):
            v.assign(a)

    def evaluate(self, x, y) -> tuple[float, int, int]:
        if len(x) == 0:
            return 0.0, 0, 0
        logits = self.model(tf.constant(x), training=False)
        loss = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        correct = int(tf.reduce_sum(tf.cast(tf.argmax(logits, axis=1) == y, tf.int32)))
        return float(tf.reduce_sum(loss)), correct, len(y)

    def save(self, folder: Path) -> None:
        _save_arrays(folder / WEIGHTS_FILE, self.model.get_weights())
        _save_arrays(folder / OPTIMIZER_FILE, [v.numpy() for v in self.optimizer.variables])

    def load(self, folder: Path) -> None:
        self.model.set_weights(_load_arrays(folder / WEIGHTS_FILE))
        state = _load_arrays(folder / OPTIMIZER_FILE)
        if len(state) != len(self.optimizer.variables):
            raise ValueError(f"{OPTIMIZER_FILE} holds {len(state)} arrays, the optimizer has "
                             f"{len(self.optimizer.variables)} (another optimizer or model?)")
        for v, value in zip(self.optimizer.variables, state):
            v.assign(value)

    def snapshot(self):
        return [v.numpy() for v in self.model.variables + list(self.optimizer.variables)]

    def restore(self, snapshot) -> None:
        for v, a in zip(self.model.variables + list(self.optimizer.variables), snapshot, strict=True):
            v.assign(a)

    def elastic_run(self, func):
        """horovod.tensorflow.elastic.run, fixed: Horovod 0.28.1's turns a TF UnknownError into a
        recoverable HorovodInternalError only for HorovodAllreduce/Allgather/Broadcast, so a peer lost
        during the step's HorovodGroupedAllreduce was not recognised, and its wrapper then returned
        None instead of re-raising: training "ended" and the job crashed after it (seen in the elastic
        test when the kill landed mid-step)."""
        from horovod.common.elastic import run_fn
        from horovod.common.exceptions import HorovodInternalError
        from horovod.tensorflow.elastic import _reset

        def wrapper(state, *args, **kwargs):
            try:
                return func(state, *args, **kwargs)
            except tf.errors.UnknownError as e:
                if "Horovod" in (e.message or ""):
                    raise HorovodInternalError(e) from e
                raise
        return run_fn(wrapper, _reset)

    def on_reset(self, config) -> None:
        self.wrap(config)   # the step graph was traced for the old world size (allreduce or not)

    def parameters(self) -> list:
        return self.model.get_weights()

    def allreduce(self, array, average: bool = True, name: str | None = None):
        out = self.hvd.allreduce(tf.constant(np.ascontiguousarray(array)),
                                 op=self.hvd.Average if average else self.hvd.Sum, name=name)
        return out.numpy()

    def allgather(self, array):
        return self.hvd.allgather(tf.constant(np.ascontiguousarray(array))).numpy()
