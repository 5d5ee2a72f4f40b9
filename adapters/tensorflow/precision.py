"""Precision for Keras (3, or tf-keras) (the interface: adapters/precision.py):
the global mixed policy (set when the session starts, before any model is built: bf16 or fp16
compute, float32 variables, so float32 gradients on the wire), fp16's dynamic loss scale and the
scaled backward (the tape's output_gradients), unscale with the finite check and the update applied
or skipped (ops in the step's graph), its state in checkpoints.
"""
from __future__ import annotations

import tensorflow as tf

from toolkit.adapters.precision import Precision as Base

POLICIES = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


class LossScale:
    """fp16's dynamic loss scale, as torch's GradScaler: starts at 2**16, halves when the reduced
    gradient is not finite (that step is skipped, on every rank alike), doubles after 2000 finite
    steps. Two variables, updated in the step's graph; saved with the checkpoints."""
    GROWTH_INTERVAL = 2000

    def __init__(self):
        self.scale = tf.Variable(2.0 ** 16, trainable=False, dtype=tf.float32, name="toolkit_loss_scale")
        self.good = tf.Variable(0, trainable=False, dtype=tf.int64, name="toolkit_good_steps")

    def update(self, finite) -> None:
        good = tf.where(finite, self.good + 1, tf.constant(0, tf.int64))
        grow = good >= self.GROWTH_INTERVAL
        self.scale.assign(tf.where(finite, tf.where(grow, self.scale * 2.0, self.scale), self.scale / 2.0))
        self.good.assign(tf.where(grow, tf.constant(0, tf.int64), good))


class Precision(Base):
    def __init__(self, name: str, keras_module):
        self.name = name
        self.loss_scale: LossScale | None = None       # fp16, made by build() when the optimizer is wrapped
        keras_module.mixed_precision.set_global_policy(POLICIES.get(name, "float32"))

    def build(self) -> None:
        """fp16's loss scale (once: an elastic reset keeps it)."""
        if self.name == "fp16" and self.loss_scale is None:
            self.loss_scale = LossScale()

    @property
    def scales(self) -> bool:
        return self.loss_scale is not None

    def backward(self, loss, tape, variables):
        """The tape's gradients of `loss`; with fp16, of loss x the loss scale (output_gradients: the
        scale enters the backward pass, so small fp16 gradients do not flush to zero)."""
        if self.loss_scale is None:
            return tape.gradient(loss, variables)
        return tape.gradient(loss, variables, output_gradients=tf.cast(self.loss_scale.scale, loss.dtype))

    def unscale(self, grads):
        """(gradients divided by the loss scale, whether every one is finite); graph ops."""
        finite = tf.constant(True)
        if self.loss_scale:
            grads = [g / self.loss_scale.scale for g in grads]
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        return grads, finite

    def step(self, update, finite) -> None:
        """`update()` in the graph, or (fp16, a gradient not finite) skipped and the loss scale lowered:
        the same on every rank, since the gradients are reduced."""
        if self.loss_scale:
            tf.cond(finite, update, lambda: tf.constant(False))
            self.loss_scale.update(finite)
        else:
            update()

    def state_dict(self) -> dict:
        """fp16's loss scale and its count of finite steps, for an exact resume; {} without one."""
        if self.loss_scale is None:
            return {}
        return {"scale": self.loss_scale.scale.numpy(), "good": self.loss_scale.good.numpy()}

    def load_state_dict(self, state: dict) -> None:
        if self.loss_scale is not None and state:
            self.loss_scale.scale.assign(state["scale"])
            self.loss_scale.good.assign(state["good"])
