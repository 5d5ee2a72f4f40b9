"""Keras 3 on Horovod's TensorFlow ops.

`horovod.tensorflow.keras` fails on Keras 3 (horovod#4290), so this strategy is the toolkit's own
Keras 3 integration on top of `horovod.tensorflow`: one GPU per local rank, rank 0's variables
broadcast, and inside the session's step graph one `hvd.allreduce` per gradient (fused by Horovod,
with the configured compression and op) and the loss averaged for nan_guard. With the toolkit's
exchange the step graph leaves the allreduce out and toolkit/exchange/communication.py moves the gradients.
`model.fit` users: `fit_optimizer` / `fit_callbacks` (adapters/tensorflow/fit.py).
"""
from __future__ import annotations

import tensorflow as tf

from toolkit.adapters.horovod import (
    HorovodStrategy,
    allreduce_gradients,
    gpu_for_local_rank,
    require_gpu_if_asked,
    threads_per_rank,
)
from toolkit.adapters.tensorflow.keras import set_threads
from toolkit.adapters.tensorflow.strategies.common import TensorflowStrategy
from toolkit.adapters.topology import Topology


class TensorflowHorovod(TensorflowStrategy, HorovodStrategy):
    module, framework = "horovod.tensorflow", "tensorflow"
    path = "Keras 3 step on horovod.tensorflow allreduce"

    def start(self, comm=None) -> Topology:
        set_threads(threads_per_rank())
        hvd = self.init(comm)
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

    def wrap(self, session) -> None:
        if not session.optimizer.built:      # its state exists on every rank, for the broadcast
            session.optimizer.build(session.model.trainable_variables)
        session.compile_steps(reduce=self.hvd.size() > 1 and not self.exchange)

    # -- inside the session's step graph ---------------------------------------------------------------
    def reduce_gradients(self, grads) -> list:
        compression, op = self.reduction()
        return allreduce_gradients(self.hvd, grads, op, compression)

    def average_loss(self, loss):
        return self.hvd.allreduce(tf.cast(loss, tf.float32), op=self.hvd.Average, name="toolkit.step_loss")

    def broadcast(self, session, root: int = 0) -> None:
        hvd = self.hvd
        for i, v in enumerate(session.model.variables + list(session.optimizer.variables)):
            v.assign(hvd.broadcast(v.value, root_rank=root, name=f"toolkit.broadcast.{i}"))

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

    def on_reset(self, session) -> None:
        self.wrap(session)   # the step graph was traced for the old world size (allreduce or not)

    # -- Keras 3 model.fit ------------------------------------------------------------------------------
    def fit_optimizer(self, session, optimizer):
        from toolkit.adapters.tensorflow import fit
        compression, op = self.reduction()
        return fit.DistributedOptimizer(optimizer, op=op, compression=compression)

    def fit_callbacks(self) -> list:
        from toolkit.adapters.tensorflow import fit
        return [fit.BroadcastCallback(), fit.MetricAverageCallback(), fit.StatisticsCallback(self)]

    # -- collectives on numpy -----------------------------------------------------------------------------
    def allreduce(self, array, average: bool = True, name: str | None = None, group=None):
        import numpy as np
        out = self.hvd.allreduce(tf.constant(np.ascontiguousarray(array)),
                                 op=self.hvd.Average if average else self.hvd.Sum, name=name,
                                 **self.process_set(group))
        return out.numpy()

    def allgather(self, array, group=None):
        import numpy as np
        return self.hvd.allgather(tf.constant(np.ascontiguousarray(array)), **self.process_set(group)).numpy()

    def alltoall(self, array, splits: list[int], group=None):
        import numpy as np
        out, _ = self.hvd.alltoall(tf.constant(np.ascontiguousarray(array)), splits=np.asarray(splits, np.int32),
                                   **self.process_set(group))
        return out.numpy()
