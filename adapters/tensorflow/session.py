"""TensorFlow 2.21 + Keras 3, the session's step on a strategy that reduces inside it (Horovod's:
adapters/tensorflow/strategies/horovod.py).

A step computes the local gradients of `accumulation_steps` micro-batches, reduces them (the
strategy's allreduce per gradient), unscales them (fp16, the precision's), measures and clips the
reduced gradient, adds coupled L2 weight decay (the same meaning as torch's and MXNet's
`weight_decay`) and applies them or (fp16 overflow) skips, in one graph call (`train_step`, as
Horovod's own TF2 examples do), or after the user's own `backward(loss, tape)` calls (`step`). With
the toolkit's exchange the reduce is left out and toolkit/exchange/communication.py moves the gradients.
"""
from __future__ import annotations

import tensorflow as tf

from toolkit.adapters.tensorflow.keras import KerasSession
from toolkit.errors import ToolkitError


class TensorflowSession(KerasSession):
    name = "tensorflow"
    any_batch = True            # the built-in step's batches of any structure (adapters/batches.py)

    def _refuse_another_model(self) -> None:
        super()._refuse_another_model()
        if self.precision.scales:
            raise ToolkitError("session.setup() of a second model with precision fp16: TensorFlow's loss scale "
                               "is one model's; train several models in fp32 or bf16")

    def compile_steps(self, reduce: bool) -> None:
        """The step's graph functions, in the facade's order (adapters/base.py `_reduce_and_apply`):
        reduce (the strategy's allreduce, where `reduce`) -> unscale (precision) -> clip -> finite
        check, apply or skip (precision). clip_grad_norm: the reduced gradient's norm and clipping in
        the same graph (not Adasum's, refused with it); the toolkit's exchange clips before
        apply_local. nan_guard: the loss averaged over the ranks in the same graph call."""
        c, strategy, precision = self.config, self.strategy, self.precision
        variables = self.model.trainable_variables
        measure, clip = self.measures_norm, c.clip_grad_norm
        average_loss = self.reduces_loss and reduce
        precision.build()

        def apply(grads, loss, allreduce, measured=measure):
            if allreduce:
                grads = strategy.reduce_gradients(grads)
            grads, finite = precision.unscale(grads)
            norm = tf.linalg.global_norm(grads) if measured else tf.constant(-1.0)
            if measured:
                grads, _ = tf.clip_by_global_norm(grads, clip, use_norm=norm)

            def update():
                self.optimizer.apply_gradients(zip(self._with_weight_decay(grads), variables))
                return tf.constant(True)

            precision.step(update, finite)
            if average_loss and allreduce:
                loss = strategy.average_loss(loss)
            return norm, loss, finite

        def step(batches):
            loss, grads = self._local_sum(batches)
            return loss, *apply(grads, loss, reduce)

        # One graph call per optimizer step (gradients, allreduce, norm and update together);
        # traced once per micro-batch count and shape.
        self._step_fn = tf.function(step)
        self._apply_fn = tf.function(lambda grads, loss: apply(grads, loss, reduce))
        self._local_gradients_fn = tf.function(self._local_sum)
        self._apply_local_fn = tf.function(lambda grads: apply(grads, 0.0, False, measured=False))

    def _train_step(self, batches):
        loss, norm, reduced, finite = self._step_fn(tuple(batches))
        self._after_apply(norm, reduced, finite)
        return loss

    def _apply_step(self) -> None:
        grads, self._pending = self._pending, None
        self._after_apply(*self._apply_fn(grads, self._pending_loss))

    def _after_apply(self, norm, reduced_loss, finite) -> None:
        if self.precision.loss_scale is not None:     # fp16: a skipped step is counted, not an error (one host read)
            self.step_skipped = not bool(finite)
        if self.measures_norm:
            self.grad_norm = norm
        if self.reduces_loss:
            self.step_loss = reduced_loss

    # -- Keras 3 model.fit ------------------------------------------------------------------------------
    def fit_optimizer(self, optimizer=None):
        """For `model.compile(optimizer=...)`: the config's optimizer (or yours) that allreduces
        its gradients as the config says (op, fp16 compression) before applying them. Yours is
        converted in place (its learning-rate schedule, slots and step count kept): give it the one
        `setup` returned, and fit trains the optimizer the session checkpoints. Then step it with
        fit only (session.step and train_step reduce on their own: twice)."""
        return self.strategy.fit_optimizer(self, optimizer if optimizer is not None else self._make_optimizer(None))

    def fit_callbacks(self) -> list:
        """For `model.fit(callbacks=...)`, first in the list: rank 0's weights on every rank at the
        start; at each epoch's end, metrics and the moving statistics (BatchNormalization's)
        averaged over the ranks, so `model.get_weights()` is the same on every rank."""
        return self.strategy.fit_callbacks()
