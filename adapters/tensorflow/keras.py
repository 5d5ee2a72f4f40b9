"""What the Keras 3 sessions share, whatever moves the gradients (Horovod in session.py, TensorFlow's
strategies in native.py): the model and optimizer, the default loss, data, the backward pass on a
tape, coupled L2 weight decay, evaluation, the toolkit's exchange on numpy, checkpoints of the
model's and the optimizer's variables.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from toolkit.adapters import batches as batches_module
from toolkit.adapters import randomness
from toolkit.adapters.base import Session
from toolkit.adapters.parts import part_own
from toolkit.adapters.tensorflow import data
from toolkit.config import Optimizer
from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.adapters.tensorflow.precision import Precision
    from toolkit.adapters.tensorflow.strategies.common import TensorflowStrategy

WEIGHTS_FILE = "weights.npz"
OPTIMIZER_FILE = "optimizer.npz"
LOSS_SCALE_FILE = "loss_scale.npz"     # fp16's loss scale (adapters/tensorflow/precision.py)


def part_files(index: int) -> tuple[str, str]:
    """A checkpoint's files of the index-th model set up: weights.npz and optimizer.npz for the first,
    weights1.npz and optimizer1.npz for the second, ..."""
    if index == 0:
        return WEIGHTS_FILE, OPTIMIZER_FILE
    return f"weights{index}.npz", f"optimizer{index}.npz"


def set_threads(threads: int) -> None:
    """TensorFlow's op thread pools (before its runtime starts)."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def make_optimizer(config, keras_module=keras):
    """The configured optimizer from `keras_module` (Keras 3, or tf_keras for the legacy path)."""
    if config.optimizer is Optimizer.SGD:
        return keras_module.optimizers.SGD(learning_rate=config.lr, momentum=config.optimizer_momentum)
    return keras_module.optimizers.Adam(learning_rate=config.lr)


def statistics(model) -> list:
    """The model's floating-point state that is not trained (BatchNormalization's moving mean and
    variance), whichever Keras made it (a dtype name in Keras 3, a tf.DType in tf-keras)."""
    return [v for v in model.non_trainable_variables if tf.as_dtype(v.dtype).is_floating]


def lr_schedule(optimizer, keras_module=keras):
    """The optimizer's LearningRateSchedule (`keras_module`'s: Keras 3 or tf_keras; through a
    loss-scale wrapper), or None when its learning rate is a plain value."""
    lr = getattr(getattr(optimizer, "inner_optimizer", optimizer), "_learning_rate", None)
    return lr if isinstance(lr, keras_module.optimizers.schedules.LearningRateSchedule) else None


def save_arrays(path: Path, arrays) -> None:
    with open(path, "wb") as f:      # a file object: np.savez would append .npz to a bare name
        np.savez(f, *arrays)


def load_arrays(path: Path) -> list:
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def dense(grads: list) -> list:
    """Gradients with an embedding's (IndexedSlices: the rows a batch touched) made dense, as Horovod's
    `sparse_as_dense=True` does: accumulation, weight decay, fp16's unscale, clipping and the toolkit's exchange
    then treat it as any other gradient. None (a variable the loss did not reach) stays None."""
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


class KerasSession(Session):
    """Keras 3 parts of a session; subclasses add the steps that reduce gradients (with the strategy)."""
    keras = keras
    strategy: TensorflowStrategy
    precision: Precision
    # per model (several models: each its own), kept in the active part: the step's summed micro-batch
    # gradients (backward) and the subclass's compiled graph functions (compile_steps)
    _pending = part_own("pending")
    _step_fn = part_own("step_fn")
    _apply_fn = part_own("apply_fn")
    _local_gradients_fn = part_own("local_gradients_fn")
    _apply_local_fn = part_own("apply_local_fn")
    _pending_loss: Any          # the last backward passes' mean loss (every model they reached steps on it)

    def _seed(self, seed: int) -> None:
        self.keras.utils.set_random_seed(seed)

    def _seed_states(self) -> list:
        """Keras 3's random state: its global seed generator's (`keras.random.*` without a seed) and each
        set-up model's own (Dropout and the other random layers keep a `SeedGenerator`). TensorFlow's
        stateful ops without a generator (`tf.random.normal`) keep theirs out of reach: not restored."""
        try:
            from keras.src.random.seed_generator import global_seed_generator
            found = [global_seed_generator().state]
        except (ImportError, AttributeError):          # a Keras that moved it: the models' own only
            found = []
        for part in self.parts:
            found += [v for v in part.model.variables if v.name == "seed_generator_state"]
        return found

    def _framework_random(self) -> dict:
        return {"keras": [[str(v.dtype), randomness.encode(np.asarray(v.numpy()))] for v in self._seed_states()]}

    def _set_framework_random(self, state: dict) -> None:
        variables = self._seed_states()
        if len(variables) != len(state["keras"]):
            raise ToolkitError(f"the checkpoint holds {len(state['keras'])} Keras seed generators, this model "
                               f"{len(variables)}: resume with the model that saved it")
        for v, (dtype, text) in zip(variables, state["keras"]):
            v.assign(randomness.decode(text, np.dtype(dtype)).reshape(v.shape))

    def _make_precision(self):
        """The config's mixed policy for every model built after start; fp16's loss scale."""
        from toolkit.adapters.tensorflow.precision import Precision
        return Precision(self.config.precision.value, self.keras)

    def _gradients(self, tape, loss, variables):
        return dense(self.precision.backward(loss, tape, variables))

    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        from toolkit.adapters.tensorflow import models
        return models.build(self.config, num_features, num_classes, input_shape=input_shape)

    def _place(self, model):
        if not isinstance(model, self.keras.Model):
            raise ToolkitError(f"session.setup(model): expected a {self.keras.__name__}.Model, got {type(model).__name__}")
        if not model.built:
            raise ToolkitError("session.setup(model): the Keras model has no weights yet; build it first "
                               "(keras.Input(...) as its first layer, or model.build(input_shape))")
        if self.config.sync_batchnorm:      # batch statistics over every replica (batchnorm.py)
            from toolkit.adapters.tensorflow import batchnorm
            batchnorm.synchronize(model, getattr(self.strategy, "hvd", None))
        return model

    def _make_optimizer(self, model):
        return make_optimizer(self.config, self.keras)

    def _cross_entropy(self, logits, labels):
        logits = tf.cast(logits, tf.float32)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

    def set_lr(self, lr: float) -> None:
        self._refuse_schedule()
        self.optimizer.learning_rate = lr

    def _refuse_schedule(self) -> None:
        """A Keras LearningRateSchedule sets the rate at every step from the optimizer's own
        iteration count; Keras refuses to overwrite it with a TypeError deep in its setter."""
        schedule = lr_schedule(self.optimizer, self.keras)
        if schedule is not None:
            raise ToolkitError(f"session.set_lr(): the optimizer's learning_rate is a {type(schedule).__name__} "
                               "schedule, which sets it at every step; leave the rate to the schedule, or give "
                               "setup() an optimizer with a plain learning_rate to set it here")

    # -- data ---------------------------------------------------------------------------------------
    dataset_kind = "a tf.data.Dataset (elements: a tuple such as (x, y), or a dict)"

    def _dataset_length(self, dataset):
        return data.length(dataset)

    def _is_stream(self, dataset) -> bool:
        return isinstance(dataset, tf.data.Dataset) and int(dataset.cardinality()) < 0

    def _stream_batches(self, dataset, batch_size, drop_last, **reader):
        if reader:
            raise ToolkitError(f"session.loader(tf.data.Dataset, {', '.join(reader)}=...): tf.data takes no reader "
                               "options here; set them on the dataset")
        yield from dataset.batch(batch_size, drop_remainder=drop_last).prefetch(tf.data.AUTOTUNE)

    def _tensor(self, array):
        return tf.constant(array)

    def _dataset_batches(self, dataset, plan, sampler, **reader):
        if reader:      # tf.data has no reader object to pass options to: they belong on the dataset
            raise ToolkitError(f"session.loader(tf.data.Dataset, {', '.join(reader)}=...): tf.data takes no reader "
                               "options here; set them on the dataset (dataset.map(fn, num_parallel_calls=...))")
        return data.batches(dataset, plan, sampler)

    # -- gradients -----------------------------------------------------------------------------------
    def backward(self, loss, tape=None) -> None:
        if tape is None:
            raise ToolkitError("TensorFlow computes gradients from a tape: compute the loss under "
                               "`with tf.GradientTape() as tape:` and call session.backward(loss, tape)")
        self._new_backward()
        k = self.config.accumulation_steps
        parts = self.parts if len(self.parts) > 1 else [self.part]
        variables = [part.model.trainable_variables for part in parts]
        # one tape.gradient call for every model (a tape answers once); (loss / k here would be off the tape)
        flat = self._gradients(tape, loss, [v for vs in variables for v in vs])
        at = 0
        for part, vs in zip(parts, variables):
            grads, at = flat[at:at + len(vs)], at + len(vs)
            if len(parts) > 1 and all(g is None for g in grads):
                continue            # a model the loss did not reach keeps what it had (as in plain TensorFlow)
            if k > 1:
                grads = [g / k for g in grads]
            pending = part.own.get("pending")
            part.own["pending"] = (grads if pending is None or self.micro == 0 else
                                     [a + b for a, b in zip(pending, grads)])
        loss = tf.cast(loss, tf.float32) / k
        self._pending_loss = loss if self.micro == 0 else self._pending_loss + loss     # the step's mean loss
        self.micro += 1

    def has_gradients(self, part) -> bool:
        return part.own.get("pending") is not None

    def _with_weight_decay(self, grads):
        """Coupled L2 (torch's and MXNet's meaning of weight_decay): gradient + wd * weight."""
        wd = self.config.weight_decay
        if not wd:
            return grads
        return [g + wd * v.value for g, v in zip(grads, self.model.trainable_variables)]

    def _local_sum(self, batches):
        """Mean loss and summed gradients over the micro-batches (a tuple: unrolled in the graph)."""
        variables = [v.value for v in self.model.trainable_variables]
        total, summed = 0.0, None
        for batch in batches:
            with tf.GradientTape() as tape:
                loss = self._batch_loss(batch) / len(batches)
            grads = self._gradients(tape, loss, variables)
            summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
            total += loss
        return total, summed

    def _batch_loss(self, batch):
        """One micro-batch's mean loss in the built-in step: `(x, y)` as the setup loss of the model in training
        mode; any other structure as adapters/batches.py says (the model on `call_model`, the user's loss on the
        whole batch)."""
        if batches_module.is_pair(batch):
            x, y = batch
            return self.loss_fn(self.model(x, training=True), y)
        return tf.reduce_mean(batches_module.loss_of(self, batch))

    def call_model(self, batch):
        """A tuple's first field; a dict whole (a Keras model takes a dict keyed by its inputs' names); one
        tensor as it is; in training mode inside the step, in inference mode in evaluate()."""
        return self.model(batch[0] if isinstance(batch, (tuple, list)) else batch, training=self._training)

    _training = True

    def _train_mode(self, training: bool) -> None:
        self._training = training

    def local_gradients(self, batches=None):
        if batches is None:
            grads, self._pending = self._pending, None
            return None, [g.numpy() for g in grads]
        loss, grads = self._local_gradients_fn(tuple(batches))
        return loss, [g.numpy() for g in grads]

    def apply_gradients(self, grads) -> None:
        self._apply_local_fn([tf.constant(g) for g in grads])

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

    def _statistics(self) -> list:
        return statistics(self.model)

    def _buffers(self) -> list:
        return [v.numpy() for v in self._statistics()]

    def _set_buffers(self, arrays) -> None:
        for v, a in zip(self._statistics(), arrays, strict=True):
            v.assign(np.asarray(a, tf.as_dtype(v.dtype).as_numpy_dtype))

    def _evaluate_batch(self, x, y):
        out = self.model(x, training=False)
        loss = float(self.loss_fn(out, y)) * int(tf.shape(y)[0])
        if len(out.shape) == 2 and len(y.shape) == 1 and y.dtype.is_integer:
            correct = int(tf.reduce_sum(tf.cast(tf.argmax(out, axis=1) == tf.cast(y, tf.int64), tf.int32)))
            return np.array([loss, correct, int(tf.shape(y)[0]), 0], np.float64)
        return np.array([loss, 0, int(tf.shape(y)[0]), 1], np.float64)

    def to_float(self, value) -> float:
        if len(getattr(value, "shape", ())) == 0:   # one value (the step's loss and norm): no extra op
            return float(value)
        return float(tf.reduce_mean(value))      # a loss of one value per sample: its mean

    # -- checkpoints, elastic ------------------------------------------------------------------------------
    def _save_objects(self, folder: Path) -> None:
        for index, part in enumerate(self.parts or [self.part]):
            weights, optimizer = part_files(index)
            save_arrays(folder / weights, part.model.get_weights())
            save_arrays(folder / optimizer, [v.numpy() for v in part.optimizer.variables])
        state = self.precision.state_dict()
        if state:       # fp16's loss scale
            save_arrays(folder / LOSS_SCALE_FILE, [state["scale"], state["good"]])

    def _load_objects(self, folder: Path) -> None:
        parts = self.parts or [self.part]
        saved = len(list(folder.glob("weights*.npz")))
        if saved != len(parts):
            raise ToolkitError(f"checkpoint {folder} holds {saved} model(s), this session set up {len(parts)}; "
                               "resume with the models it was saved with")
        for index, part in enumerate(parts):
            weights, optimizer = part_files(index)
            part.model.set_weights(load_arrays(folder / weights))
            state = load_arrays(folder / optimizer)
            if len(state) != len(part.optimizer.variables):
                raise ValueError(f"{optimizer} holds {len(state)} arrays, the optimizer has "
                                 f"{len(part.optimizer.variables)} (another optimizer or model?)")
            for v, value in zip(part.optimizer.variables, state):
                v.assign(value)
        if (folder / LOSS_SCALE_FILE).is_file():
            scale, good = load_arrays(folder / LOSS_SCALE_FILE)
            self.precision.load_state_dict({"scale": scale, "good": good})

    def snapshot(self):
        return [v.numpy() for v in self.model.variables + list(self.optimizer.variables)]

    def restore(self, snapshot) -> None:
        for v, a in zip(self.model.variables + list(self.optimizer.variables), snapshot, strict=True):
            v.assign(a)

    def replica_parameters(self) -> list[list]:
        """Every model's weights, in setup order."""
        return [[w for part in (self.parts or [self.part]) for w in part.model.get_weights()]]
