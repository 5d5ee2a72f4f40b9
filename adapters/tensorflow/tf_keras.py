"""TensorFlow with legacy Keras 2 (the tf-keras package): its tensor work; Horovod's own
`horovod.tensorflow.keras` moves the gradients (adapters/tensorflow/strategies/tf_keras.py).

`TF_USE_LEGACY_KERAS=1` is set here, before TensorFlow is imported, so `tf.keras` is tf-keras. The
built-in step is Keras's compiled `train_on_batch` with Horovod's DistributedOptimizer inside; a
user's own loop calls `backward(loss, tape)`, which hands each micro-batch's gradients to that
optimizer (it aggregates k of them, then allreduces and applies). Several models (a GAN) step as on
Keras 3: each model's gradients summed over the micro-batches, then Horovod's allreduce and the model's
optimizer (whose own aggregation never counts then: it applies every call). Data, evaluation, checkpoints and
tensor ops are the Keras 3 session's (keras.py).
"""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"      # before tensorflow is imported below, so tf.keras is tf-keras

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from toolkit.adapters.tensorflow import models  # noqa: E402
from toolkit.adapters.tensorflow.session import TensorflowSession  # noqa: E402
from toolkit.errors import ToolkitError  # noqa: E402


def build_model(config, num_features: int, num_classes: int) -> tf_keras.Model:
    # Coupled L2, the meaning torch's and MXNet's weight_decay have: gradient + wd * w on every
    # weight. Keras's l2(c) adds c * sum(w^2) to the loss, whose gradient is 2c * w.
    reg = (lambda: tf_keras.regularizers.l2(config.weight_decay / 2)) if config.weight_decay else None
    return models.build(config, num_features, num_classes, keras_module=tf_keras, regularizer=reg)


class TfKerasSession(TensorflowSession):
    name = "tensorflow"
    keras = tf_keras
    any_batch = False           # the step is Keras's train_on_batch(x, y)

    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        return build_model(self.config, num_features, num_classes)

    def _cross_entropy(self, logits, labels):
        return tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(labels, tf.cast(logits, tf.float32),
                                                                              from_logits=True))

    random_restorable = False       # tf-keras draws from TensorFlow's stateful ops: resume reseeds

    def _framework_random(self) -> dict:
        return {}

    def _with_weight_decay(self, grads):
        return grads        # tf-keras: the L2 regularizers of the model's layers (build_model)

    def _train_step(self, batches):
        # Horovod's optimizer aggregates locally and allreduces + applies on every k-th call.
        losses = [float(self.model.train_on_batch(x, y)) for x, y in batches]
        return sum(losses) / len(losses)

    def backward(self, loss, tape=None) -> None:
        """The user's loss plus the model's layer losses (`model.losses`: L2 regularizers, which
        build_model uses for weight_decay; so a user's loss leaves them out), through Horovod's
        optimizer. Several models: every model's layer losses added under the tape, then the Keras 3
        session's backward (one tape.gradient for every model; each reached model's gradients kept for its
        step, which reduces them with Horovod's allreduce and applies them with its optimizer)."""
        if tape is None:
            raise ToolkitError("TensorFlow computes gradients from a tape: compute the loss under "
                               "`with tf.GradientTape() as tape:` and call session.backward(loss, tape)")
        if len(self.parts) > 1:
            with tape:      # the layers' L2 terms are computed when read: under the tape, or no gradient
                terms = [t for part in self.parts for t in part.model.losses]
                with_terms = loss + tf.add_n(terms) if terms else loss
            super().backward(with_terms, tape)
            return
        # Keras's own train_step path: Horovod's optimizer allreduces in compute_gradients (every k-th
        # call: it aggregates locally before), not in apply_gradients, so minimize, not apply_gradients
        # (which applied each rank's own gradients: replicas drifted apart). The layers' L2 terms are
        # computed when `model.losses` is read: read back under the user's tape, or they have no gradient.
        def total():
            terms = self.model.losses
            return loss + tf.add_n(terms) if terms else loss
        self.optimizer.minimize(total, self.model.trainable_variables, tape=tape)
        self.micro += 1

    def _apply_step(self) -> None:
        if len(self.parts) > 1:
            super()._apply_step()
        # one model: the k-th backward() applied it (Horovod's backward_passes_per_step)
