"""TensorFlow's own strategies, no Horovod: MirroredStrategy and MultiWorkerMirroredStrategy, Keras 3.

`strategy: mirrored` drives several devices from one process (on CPU: N logical devices);
`strategy: multi_worker_mirrored` runs one process per worker, found through TF_CONFIG (which
`toolkit launch --backend native` writes). Keras 3 `model.fit` under MultiWorkerMirroredStrategy
is broken upstream (keras-team/keras#20585), so both run the toolkit's custom loop with
`strategy.run`, the same meaning as the Horovod path:

- replica 0's state is copied to every replica by a collective (what Horovod's broadcast does);
- a step computes the local gradients of `accumulation_steps` micro-batches and reduces them once
  (Keras 3's optimizer all-reduces SUM across replicas inside `apply_gradients`; the toolkit
  scales by 1/replicas for op=average);
- coupled L2 weight decay, lr schedule, checkpoints and object collectives as everywhere else.

A user's own loop (`backward(loss, tape)`, `step()`, several models) runs per process, as on Horovod:
the loss's gradients on the process's whole batch, summed over the processes by the strategy's
collective (`reduce_gradients`), applied in the cross-replica context, where Keras 3's optimizer
updates every replica's copy with the one reduced gradient.
"""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import tensorflow as tf

from toolkit.adapters.horovod import require_gpu_if_asked, threads_per_rank
from toolkit.adapters.strategy import Strategy
from toolkit.adapters.tensorflow.keras import dense, set_threads
from toolkit.adapters.tensorflow.strategies.common import TensorflowStrategy
from toolkit.adapters.topology import Topology
from toolkit.config import Op, TfStrategy
from toolkit.data.batch import leading_size
from toolkit.errors import ToolkitError

SUM = tf.distribute.ReduceOp.SUM


def tf_config_topology(text: str) -> tuple[int, int, int, int]:
    """(task index, workers, local rank, workers on this host) from a TF_CONFIG value."""
    try:
        tf_config = json.loads(text)
        workers = list(tf_config["cluster"]["worker"])
        task = tf_config["task"]
        index = int(task["index"])
        if task.get("type", "worker") != "worker" or not 0 <= index < len(workers):
            raise ValueError(f"task {task} is not one of the {len(workers)} workers")
    except (ValueError, KeyError, TypeError) as e:
        raise ToolkitError(f"TF_CONFIG is not a worker cluster ({e.__class__.__name__}: {e}); start the "
                           "workers with `toolkit launch --framework tensorflow --backend native -np N -- ...`") from None

    def host(address):
        return address.rsplit(":", 1)[0]

    same_host = [i for i, w in enumerate(workers) if host(w) == host(workers[index])]
    return index, len(workers), same_host.index(index), len(same_host)


class TensorflowNative(TensorflowStrategy, Strategy):
    name = "native"

    def start(self, comm=None) -> Topology:
        config = self.config
        if comm is not None:
            raise ToolkitError("backend=native runs TensorFlow's own collectives, not MPI: drop comm= from "
                               "toolkit.start, or use backend: horovod to run on your MPI communicator")
        kind = config.strategy or (TfStrategy.MULTI_WORKER_MIRRORED if "TF_CONFIG" in os.environ
                                   else TfStrategy.MIRRORED)
        if kind is TfStrategy.MULTI_WORKER_MIRRORED:
            if "TF_CONFIG" not in os.environ:
                raise ToolkitError("strategy=multi_worker_mirrored needs TF_CONFIG on every worker; start them with "
                                   "`toolkit launch --framework tensorflow --backend native -np N -- ...`")
            rank, size, local_rank, local_size = tf_config_topology(os.environ["TF_CONFIG"])
        else:
            rank, size, local_rank, local_size = 0, 1, 0, 1
        set_threads(threads_per_rank(local_size))
        gpus = tf.config.list_physical_devices("GPU")
        require_gpu_if_asked(bool(gpus))
        if kind is TfStrategy.MULTI_WORKER_MIRRORED:
            if gpus:   # one GPU per worker process, as under Horovod
                tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
            implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL if gpus
                              else tf.distribute.experimental.CommunicationImplementation.RING)
            self.tf = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation))
            device = f"gpu:{local_rank % len(gpus)}" if gpus else "cpu"
        else:
            devices = self._mirrored_devices(gpus, config.num_devices)
            self.tf = tf.distribute.MirroredStrategy(devices)
            device = ",".join(d.strip("/").lower() for d in devices)
        replicas = self.tf.num_replicas_in_sync // size
        strategy_name = "MultiWorkerMirroredStrategy" if kind is TfStrategy.MULTI_WORKER_MIRRORED else "MirroredStrategy"
        self.path = f"tf.distribute.{strategy_name}, Keras 3 custom loop"
        self.size, self.rank, self.replicas = size, rank, replicas
        self._process_sum = self._make_process_sum()
        return Topology(rank, size, local_rank, local_size, device, replicas)

    @staticmethod
    def _mirrored_devices(gpus, wanted) -> list[str]:
        if gpus:
            if wanted and wanted > len(gpus):
                raise ToolkitError(f"num_devices={wanted} but TensorFlow sees {len(gpus)} GPU(s); "
                                   f"use --num-devices {len(gpus)} or fewer")
            return [f"/gpu:{i}" for i in range(wanted or len(gpus))]
        wanted = wanted or 1
        if wanted > 1:   # one CPU split into logical devices, so mirrored runs (and is tested) anywhere
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
        return [f"/cpu:{i}" for i in range(wanted)]

    def scope(self):
        return self.tf.scope()

    def wrap(self, session) -> None:
        with self.tf.scope():
            if not session.optimizer.built:
                session.optimizer.build(session.model.trainable_variables)
        if len(session.parts) == 1:
            session.start_replicas_apart()
        self._compile_steps(session)
        session.compile_steps(reduce=True)      # the user's loop: backward(loss, tape), step()

    def _compile_steps(self, session) -> None:
        variables, replicas, k = session.model.trainable_variables, self.tf.num_replicas_in_sync, \
            session.config.accumulation_steps
        # Keras all-reduces SUM over replicas in apply_gradients: 1/replicas turns it into the average.
        scale = 1.0 / replicas if session.config.op is Op.AVERAGE else 1.0
        weight_decay = session.config.weight_decay / replicas     # summed over replicas: + wd * w, once

        def replica_step(batch):
            grads, total = None, 0.0
            for j in range(k):                          # k micro-batches, one reduction
                with tf.GradientTape() as tape:
                    loss = session._batch_loss(tf.nest.map_structure(lambda a, j=j: a[j], batch)) / k
                g = dense(tape.gradient(loss, [v.value for v in variables]))
                grads = g if grads is None else [a + b for a, b in zip(grads, g)]
                total += loss
            grads = [g * scale + weight_decay * v.value for g, v in zip(grads, variables)]
            session.optimizer.apply_gradients(zip(grads, variables))
            return total

        @tf.function
        def step(batch):
            return self.tf.run(replica_step, args=(batch,))

        session._native_step = step

    # -- inside the session's step graph, a user's loop (cross-replica context) ------------------------
    def reduce_gradients(self, grads) -> list:
        """This process's gradients (of its replicas' whole batch) reduced over the processes as `op`
        says: average, or the sum over every replica (this process's mean gradient x its replicas)."""
        if self.size > 1:
            summed = self.tf.run(self._keep_one_per_process, args=(list(grads),))
            grads = [self.tf.experimental_local_results(g)[0] for g in summed]
        if self.config.op is Op.AVERAGE:
            return [g / self.size for g in grads] if self.size > 1 else list(grads)
        return [g * self.replicas for g in grads]

    def average_loss(self, loss):
        loss = tf.cast(loss, tf.float32)
        if self.size == 1:
            return loss
        return self.tf.experimental_local_results(self.tf.run(self._keep_one_per_process, args=(loss,)))[0] / self.size

    def _keep_one_per_process(self, values):
        """Replica context: the SUM over processes of `values` (a structure every replica of a process
        holds the same of), the first replica of each process counting."""
        ctx = tf.distribute.get_replica_context()
        keep = tf.equal(ctx.replica_id_in_sync_group % self.replicas, 0)
        return ctx.all_reduce(SUM, tf.nest.map_structure(lambda v: v * tf.cast(keep, v.dtype), values))

    def broadcast(self, session, root: int = 0) -> None:
        """Replica 0's model and optimizer state on every replica (masked SUM all-reduce)."""
        variables = session.model.weights + list(session.optimizer.variables)

        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            keep = tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)
            return ctx.all_reduce(SUM, [tf.cast(v.value, tf.float64) * keep for v in variables])

        reduced = tf.function(lambda: self.tf.run(replica_fn))()
        for v, value in zip(variables, reduced):
            self.tf.extended.update(v.value, lambda var, x: var.assign(tf.cast(x, var.dtype)),
                                    args=(value,), group=False)

    def train_step(self, session, batches) -> float:
        """`batches`: k micro-batches of any one structure ((x, y), a triple, a dict); each leaf stacked to
        [k, b * replicas, ...], replica i owning [i*b:(i+1)*b] of every leaf."""
        local = self.replicas
        b = leading_size(batches[0]) // local
        stacked = tf.nest.map_structure(lambda *leaves: np.stack([np.asarray(a) for a in leaves]), *batches)
        first = self.rank * local

        def per_replica(a):
            return self.tf.experimental_distribute_values_from_function(
                lambda ctx: tf.constant(a[:, (ctx.replica_id_in_sync_group - first) * b:][:, :b]))

        losses = session._native_step(tf.nest.map_structure(per_replica, stacked))
        return float(np.mean([t.numpy() for t in self.tf.experimental_local_results(losses)]))

    # -- collectives over processes, through the strategy's own all-reduce -------------------------
    def _make_process_sum(self):
        return tf.function(lambda value: self.tf.run(self._keep_one_per_process, args=(value,)),
                           reduce_retracing=True)

    def _sum_over_processes(self, array: np.ndarray) -> np.ndarray:
        if self.size == 1:
            return array
        out = self._process_sum(tf.constant(array))
        return self.tf.experimental_local_results(out)[0].numpy()

    def allreduce(self, array, average: bool = True, name: str | None = None, group=None):
        if group is not None:
            raise self.refuse("groups of ranks (the hierarchical exchange)")
        total = self._sum_over_processes(np.ascontiguousarray(array))
        return total / self.size if average else total

    def allgather_object(self, obj, name: str) -> list:
        if self.size == 1:
            return [obj]
        payload = np.frombuffer(pickle.dumps(obj), np.uint8)
        lengths = np.zeros(self.size, np.int32)
        lengths[self.rank] = len(payload)
        lengths = self._sum_over_processes(lengths)
        rows = np.zeros((self.size, int(lengths.max())), np.int32)
        rows[self.rank, :len(payload)] = payload
        rows = self._sum_over_processes(rows)
        return [pickle.loads(rows[r, :lengths[r]].astype(np.uint8).tobytes()) for r in range(self.size)]

    def broadcast_object(self, obj, name: str, root: int = 0):
        return self.allgather_object(obj if self.rank == root else None, name)[root]

    def allgather(self, array, group=None):
        raise self.refuse("toolkit exchange")
