"""TensorFlow 2.21 + Keras 3 through Horovod's TensorFlow ops.

`horovod.tensorflow.keras` fails on Keras 3 (horovod#4290), so this session is the toolkit's own
Keras 3 integration on top of `horovod.tensorflow`: a step computes the local gradients of
`accumulation_steps` micro-batches, allreduces them (one `hvd.allreduce` per gradient, fused by
Horovod, with the configured compression and op), adds coupled L2 weight decay (the same meaning as torch's and
MXNet's `weight_decay`) and applies them, in one graph call (`train_step`, as Horovod's own TF2
examples do), or after the user's own `backward(loss, tape)` calls (`step`). With the toolkit's
exchange (compression bf16/int8/topk/powersgd, local SGD) the allreduce is left out and
toolkit/communication.py moves the gradients. `model.fit` users: adapters/tensorflow/fit.py.
"""
from __future__ import annotations

import tensorflow as tf

from toolkit.adapters.base import Topology
from toolkit.adapters.horovod import gpu_for_local_rank, reduction, require_gpu_if_asked, start_horovod, threads_per_rank
from toolkit.adapters.tensorflow.keras import KerasSession, load_arrays, save_arrays, set_threads

LOSS_SCALE_FILE = "loss_scale.npz"


def allreduce_gradients(hvd, grads, op, compression) -> list:
    """One allreduce per gradient, as Horovod's DistributedGradientTape does: Horovod fuses them in
    its cycle, and each can start as soon as the backward pass has made its gradient. One grouped
    allreduce (`hvd.grouped_allreduce`, used before) waits for every gradient first: on ResNet-50
    (2 ranks, this CPU) it ran 0.95x the plain Horovod script, per tensor 0.995x (docs/BENCHMARKS.md).
    (Adasum's grouped form also fails in Horovod 0.28.1: `UnboundLocalError: 'tensor'`.)"""
    return [hvd.allreduce(g, op=op, compression=compression) for g in grads]


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


class TensorflowSession(KerasSession):
    name = "tensorflow"
    path = "Keras 3 step on horovod.tensorflow allreduce"

    def _start(self, comm=None) -> Topology:
        set_threads(threads_per_rank())
        self._set_precision()
        self.hvd = hvd = start_horovod(self.config, "horovod.tensorflow", "tensorflow", comm=comm)
        gpus = tf.config.list_physical_devices("GPU")
        require_gpu_if_asked(bool(gpus))
        gpu = gpu_for_local_rank(len(gpus), hvd.local_rank(), hvd.local_size(), self.config.allow_cpu)
        if gpu is not None:   # one GPU per local rank, the Horovod pattern
            tf.config.experimental.set_memory_growth(gpus[gpu], True)
            tf.config.set_visible_devices(gpus[gpu], "GPU")
        elif gpus:
            tf.config.set_visible_devices([], "GPU")
        device = f"gpu:{gpu}" if gpu is not None else "cpu"
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), device)

    def _wrap(self) -> None:
        hvd, c = self.hvd, self.config
        compression, op = reduction(hvd, c)
        if not self.optimizer.built:      # its state exists on every rank, for the broadcast
            self.optimizer.build(self.model.trainable_variables)
        variables = self.model.trainable_variables
        reduce = hvd.size() > 1 and not c.toolkit_exchange

        # clip_grad_norm: the reduced gradient's norm and clipping in the same graph (not Adasum's,
        # refused with it); the toolkit's exchange clips before apply_local. nan_guard: the loss
        # averaged over the ranks in the same graph call.
        measure, clip = self.measures_norm, c.clip_grad_norm
        average_loss = self.reduces_loss and reduce
        # fp16: the gradients are of the scaled loss; unscaled after the allreduce, before they are
        # measured and clipped; a non-finite one skips the update (the same on every rank).
        scaler = self._loss_scale = self._loss_scale or (LossScale() if c.precision.value == "fp16" else None)

        def apply(grads, loss, allreduce, measured=measure):
            if allreduce:
                grads = allreduce_gradients(hvd, grads, op, compression)
            finite = tf.constant(True)
            if scaler:
                grads = [g / scaler.scale for g in grads]
                finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
            norm = tf.linalg.global_norm(grads) if measured else tf.constant(-1.0)
            if measured:
                grads, _ = tf.clip_by_global_norm(grads, clip, use_norm=norm)

            def update():
                self.optimizer.apply_gradients(zip(self._with_weight_decay(grads), variables))
                return tf.constant(True)

            if scaler:
                tf.cond(finite, update, lambda: tf.constant(False))
                scaler.update(finite)
            else:
                update()
            if average_loss and allreduce:
                loss = hvd.allreduce(tf.cast(loss, tf.float32), op=hvd.Average, name="toolkit.step_loss")
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

    def broadcast(self, root: int = 0) -> None:
        hvd = self.hvd
        for i, v in enumerate(self.model.variables + list(self.optimizer.variables)):
            v.assign(hvd.broadcast(v.value, root_rank=root, name=f"toolkit.broadcast.{i}"))

    def _train_step(self, batches):
        loss, norm, reduced, finite = self._step_fn(tuple(batches))
        self._after_apply(norm, reduced, finite)
        return loss

    def _apply_step(self) -> None:
        grads, self._pending = self._pending, None
        self._after_apply(*self._apply_fn(grads, self._pending_loss))

    def _after_apply(self, norm, reduced_loss, finite) -> None:
        if self._loss_scale is not None:     # fp16: a skipped step is counted, not an error (one host read)
            self.step_skipped = not bool(finite)
        if self.measures_norm:
            self.grad_norm = norm
        if self.reduces_loss:
            self.step_loss = reduced_loss

    def _save_objects(self, folder) -> None:
        super()._save_objects(folder)
        if self._loss_scale is not None:     # fp16's loss scale, for an exact resume
            save_arrays(folder / LOSS_SCALE_FILE, [self._loss_scale.scale.numpy(), self._loss_scale.good.numpy()])

    def _load_objects(self, folder) -> None:
        super()._load_objects(folder)
        if self._loss_scale is not None and (folder / LOSS_SCALE_FILE).is_file():
            scale, good = load_arrays(folder / LOSS_SCALE_FILE)
            self._loss_scale.scale.assign(scale)
            self._loss_scale.good.assign(good)

    def elastic_run(self, func):
        """horovod.tensorflow.elastic.run, fixed: Horovod 0.28.1's turns a TF UnknownError into a
        recoverable HorovodInternalError only for HorovodAllreduce/Allgather/Broadcast, so a peer lost
        during the step's (then grouped) allreduce was not recognised, and its wrapper then returned
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

    def on_reset(self) -> None:
        self._wrap()   # the step graph was traced for the old world size (allreduce or not)

    # -- Keras 3 model.fit ------------------------------------------------------------------------------
    def fit_optimizer(self, optimizer=None):
        """For `model.compile(optimizer=...)`: the config's optimizer (or yours) that allreduces
        its gradients as the config says (op, fp16 compression) before applying them."""
        from toolkit.adapters.tensorflow import fit
        compression, op = reduction(self.hvd, self.config)
        return fit.DistributedOptimizer(optimizer or self._make_optimizer(None), op=op, compression=compression)

    def fit_callbacks(self) -> list:
        """For `model.fit(callbacks=...)`: rank 0's weights on every rank at the start, metrics
        averaged over the ranks at each epoch's end."""
        from toolkit.adapters.tensorflow import fit
        return [fit.BroadcastCallback(), fit.MetricAverageCallback()]

    def allreduce(self, array, average: bool = True, name: str | None = None):
        import numpy as np
        out = self.hvd.allreduce(tf.constant(np.ascontiguousarray(array)),
                                 op=self.hvd.Average if average else self.hvd.Sum, name=name)
        return out.numpy()

    def allgather(self, array):
        import numpy as np
        return self.hvd.allgather(tf.constant(np.ascontiguousarray(array))).numpy()
