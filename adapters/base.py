"""The session: the toolkit's public API, the same verbs in every framework.

(Over the 450-line rule on purpose: this is the facade, every verb of docs/API.md with its docstring, written
once; the work behind the verbs is the strategy's, the precision's, the exchange's, toolkit/data's,
adapters/checkpointer.py's, adapters/guard.py's and adapters/parts.py's.)

    session = toolkit.start("cfg.yaml", framework="torch")    # hvd.init, device, threads, seeds
    model, optimizer = session.setup(model, optimizer)       # to the device, broadcast, wrapped
    loader = session.loader(dataset)                          # this rank's share, position as state
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            session.backward(loss_fn(model(x), y))            # (TensorFlow: session.backward(loss, tape))
            session.step()                                    # every accumulation_steps-th call
        session.save(checkpoint_dir, epoch=epoch)

Everything written once is here: the order of an optimizer step (`_finish_step`, `_reduce_and_apply`),
the loaders, metrics averaged over ranks, the replica check; composed of: the checkpoints
(adapters/checkpointer.py on toolkit/run/checkpoint.py's atomic, hashed folders), the NaN guard
(adapters/guard.py), the models set up (adapters/parts.py). Three objects answer the rest, each chosen once:
- the framework's session (adapters/<framework>/session.py, a subclass): the tensor work
  (adapters/framework.py lists it): the model on the device, the backward pass, gradients and
  state as tensors, its files in a checkpoint;
- its strategy (adapters/<framework>/strategies/, from the registry): how gradients and state move
  between the ranks: start, the optimizer wrapped, broadcast, reduce, collectives (adapters/strategy.py);
- its precision (adapters/<framework>/precision.py): forward context, scaled backward, unscale,
  the step applied or skipped, its state.
Where a framework cannot do something the config asks, the registry says so in one line when the
config resolves.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from toolkit import messages, registry
from toolkit.adapters import batches as batches_module
from toolkit.adapters.checkpointer import Checkpointer
from toolkit.adapters.framework import TensorWork
from toolkit.adapters.guard import NanGuard
from toolkit.adapters.parts import Part, on_part, part_of
from toolkit.adapters.topology import Topology, digest
from toolkit.data.batch import leading_size
from toolkit.data.loader import ForeignLoader, ForeignSampler, Loader, StreamLoader
from toolkit.data.sampler import Sampler
from toolkit.data.streams import ShardSource
from toolkit.errors import ToolkitError
from toolkit.run import preemption, schedule
from toolkit.run.profile import NoProfile, StepProfile

if TYPE_CHECKING:
    from toolkit.adapters.precision import Precision
    from toolkit.adapters.strategy import Strategy
    from toolkit.config import Config
    from toolkit.run.metrics import MetricsLog

__all__ = ["Loader", "Part", "Session", "Topology", "digest"]


class Session(TensorWork):
    name: str                       # the framework
    model = on_part("model")
    optimizer = on_part("optimizer")
    loss_fn = on_part("loss_fn")
    communication = on_part("communication")

    def __init__(self, config: Config, strategy: Strategy) -> None:
        self.config = config
        self.strategy = strategy    # adapters/strategy.py: how gradients and state move
        self.precision: Precision = None    # type: ignore[assignment]  # adapters/<framework>/precision.py, by start()
        self.parts: list[Part] = []     # one per setup() call
        self._part = Part()             # the one the verbs act on (the first, outside setup and step)
        self.topology: Topology = None    # type: ignore[assignment]  # set by start(), before any verb
        self.loaders: list[Loader] = []
        self.micro = 0              # micro-batches since the last optimizer step (accumulation)
        self._stepped: list[Part] = []  # the parts stepped since the last backward pass (several models)
        self.global_step = 0        # optimizer steps, counted from the checkpoint resumed from
        self.grad_norm = None       # the last step's reduced gradient norm, before clipping (where measured)
        self.step_loss = None       # the last step's loss averaged over the ranks (nan_guard, Horovod's paths)
        self.guard = NanGuard(self, self._drain)    # nan_guard, checked one step late (adapters/guard.py)
        self.step_skipped = False   # fp16: the last step overflowed and was skipped (its loss scale lowered)
        self.skipped_steps = 0
        self.local_digests: list[str] = []
        self._metrics: MetricsLog | None = None
        self.mlflow_run_id: str | None = None   # the MLflow run a resumed checkpoint names (mlflow_tracking_uri)
        self.profile = NoProfile()      # profile_dir: the framework's profiler over profile_steps (toolkit/run/profile.py)
        # save() and load(), with this framework's files (adapters/checkpointer.py)
        self.checkpoints = Checkpointer(self, self._gather_objects, self._save_objects, self._load_objects,
                                        self._snapshot_objects)

    # -- start --------------------------------------------------------------------------------------
    @classmethod
    def start(cls, config, strategy, comm=None) -> "Session":
        """The strategy's start (hvd.init, on the mpi4py communicator `comm` when given), device per
        local rank, threads, seeds (`seed + rank`: every rank's model starts different until setup()
        broadcasts it; setup() then seeds `seed` on every rank)."""
        session = cls(config, strategy)
        session.topology = session._start(comm)
        session.precision = session._make_precision()       # before a model is built (MXNet's AMP)
        preemption.install()
        session._seed(config.seed + session.rank * session.replicas)
        if config.profile_dir:
            session.profile = StepProfile(session, lambda folder: registry.framework_module(
                session.name, "profile").start(session, folder))
        return session

    @property
    def path(self) -> str:
        """How it trains, in a few words (the JSON summary's "path"): the strategy's."""
        return self.strategy.path

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def local_rank(self) -> int:
        return self.topology.local_rank

    @property
    def local_size(self) -> int:
        return self.topology.local_size

    @property
    def device(self) -> str:
        return self.topology.device

    @property
    def replicas(self) -> int:
        return self.topology.replicas

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def refresh_topology(self) -> None:
        """Horovod elastic renumbers the ranks after workers leave or join: read them again."""
        self.topology = self.strategy.refresh(self.topology)
        if self.communication is not None:
            self.communication.rank, self.communication.world = self.rank, self.world_size

    def scope(self):
        """Where a model must be created (TensorFlow's strategy scope under backend native);
        elsewhere it does nothing: `with session.scope(): model = build()` works everywhere."""
        return self.strategy.scope()

    # -- the user's objects ---------------------------------------------------------------------------
    def setup(self, model, optimizer=None, loss=None):
        """The model on this rank's device and the optimizer wrapped as the config says (Horovod's
        distributed optimizer with compression, accumulation and op, or the toolkit's exchange);
        then rank 0's parameters, buffers and optimizer state on every rank. `optimizer=None`
        makes the config's (sgd/adam, lr, momentum, weight_decay); `loss=None` is cross-entropy on
        logits. Returns (model, optimizer): use these from now on. Call it once per model: several
        models (a GAN's generator and discriminator, each with its own optimizer) train in every framework
        and backend; `step(optimizer)` then says which one steps."""
        if self.parts:
            self._refuse_another_model()
        part = Part()
        self.parts.append(part)
        with self._using(part):
            self.model = self._place(model)
            self.optimizer = optimizer if optimizer is not None else self._make_optimizer(self.model)
            self.loss_fn = loss if loss is not None else self._cross_entropy
            part.loss_given = loss is not None
            if len(self.parts) == 1:
                self.local_digests = [digest(p) for p in self.replica_parameters()]
            if self.config.compression.value == "auto":
                self._choose_compression()
            self.strategy.wrap(self)
            self.communication = self.strategy.communication(self)
        if len(self.parts) == 1:
            self._part = part
        if not self.config.elastic:     # elastic: the State's sync broadcasts, inside hvd.elastic.run
            self.broadcast()
        # From here on the same random stream on every rank: the model is equal now, and what is
        # drawn later must agree across ranks (TensorFlow's tf.data shuffle mixes in the global seed).
        self._seed(self.config.seed)
        return part.model, part.optimizer

    compression_choice = None   # compression: auto, what it chose (toolkit/planner/auto.py `Choice`)

    def _choose_compression(self) -> None:
        """compression: auto: probe the links, time each candidate's exchange, continue with the config chosen (a
        collective: toolkit/planner/auto.py)."""
        from toolkit.planner import auto
        choice = auto.choose(self, sum(int(a.size) for a in self.weights()))
        self.config = choice.config
        if not choice.config.hierarchical_exchange:     # the groups timed for a hierarchical exchange, not kept
            self.strategy.drop_groups()
        self.strategy.reconfigure(choice.config)
        self.compression_choice = choice
        messages.say(self.rank, choice.line(), self.config.quiet)

    def _refuse_another_model(self) -> None:
        """A second setup(): refused in one line where the config moves gradients that only one model can take."""
        self.strategy.check_another_model()

    @property
    def part(self) -> Part:
        """The part the verbs act on now (the one being set up or stepped, else the first)."""
        return self._part

    @property
    def part_index(self) -> int:
        """Which setup() call made the part the verbs act on now (0: the first model)."""
        return self.parts.index(self._part)

    @contextlib.contextmanager
    def _using(self, part: Part):
        """The verbs act on `part` inside this block."""
        previous, self._part = self._part, part
        try:
            yield part
        finally:
            self._part = previous

    def loader(self, data, batch_size: int | None = None, shuffle: bool = True, train: bool = True,
               shard: bool = True, **reader) -> Loader:
        """This rank's share of `data`, in micro-batches of `batch_size` (default: the config's) on this
        rank's device. `data`: numpy arrays (a tuple of any arity, `(x, y)` the usual, or a dict of
        them, all of one length) or the framework's dataset, whose samples may be tuples or dicts (a
        micro-batch is what the framework's own reader yields). `reader`: options for that reader
        (torch's DataLoader: `collate_fn`, ...; Gluon's: `batchify_fn`). `train=False`: in order,
        every sample once across the ranks, nothing dropped (evaluation). `shard=False`: every
        sample on this rank (one rank's own evaluation, with `evaluate(collective=False)`)."""
        world, mine = (self.world_size, self.my_replicas()) if shard else (1, range(1))
        if isinstance(data, ShardSource):
            return self._stream_loader(data, batch_size, shuffle, train, world, mine, reader)
        if self._is_stream(data):
            b = batch_size or self.config.batch_size
            sampler: Sampler = ForeignSampler(b, self.config.accumulation_steps if train else 1, world, mine,
                                              train)
            loader: Loader = ForeignLoader(self, data, sampler,
                                           lambda d: self._stream_batches(d, b, train, **reader))
            if train:
                self.loaders.append(loader)
            return loader
        sampler = Sampler(self._length(data), batch_size or self.config.batch_size,
                          self.config.accumulation_steps if train else 1, world, mine,
                          self.config.seed, train=train, shuffle=shuffle)
        batches = (lambda d, plan, s: self._batches(d, plan, s, **reader)) if reader else self._batches
        loader = Loader(self, data, sampler, batches)
        if train:
            self.loaders.append(loader)
        return loader

    def _stream_loader(self, source, batch_size, shuffle, train, world, mine, reader) -> StreamLoader:
        """A loader of shards (toolkit/data/streams.py), read by adapters/<framework>/shards.py."""
        if reader:
            raise ToolkitError(f"session.loader(shards, {', '.join(reader)}=...): shards are read by the toolkit's "
                               "reader; set loader_workers in the config for more decoding processes")
        from toolkit.config import unset_default
        from toolkit.data.stream_sampler import StreamSampler
        reader_module = registry.reader(self.config.framework, "shards")
        sampler = StreamSampler([s.samples for s in source.shards], batch_size or self.config.batch_size,
                                self.config.accumulation_steps if train else 1, world, mine, self.config.seed,
                                train=train, shuffle=shuffle)
        size = source.index.image_size or self.config.image_size or unset_default("image_size")
        loader = StreamLoader(self, source, sampler,  # type: ignore[arg-type]  # StreamSampler: a Sampler's verbs
                              lambda d, reads, sizes, training: reader_module.batches(self, d, reads, sizes, size,
                                                                                      training))
        if train:
            self.loaders.append(loader)
        return loader

    def my_replicas(self) -> range:
        """The data-parallel replicas this process trains (one under Horovod; several under a mirrored strategy)."""
        return range(self.rank * self.replicas, (self.rank + 1) * self.replicas)

    # -- the step -------------------------------------------------------------------------------------
    def step(self, optimizer=None) -> bool:
        """After each micro-batch's backward(): every `accumulation_steps`-th call reduces the
        gradients (Horovod's allreduce, or the toolkit's compression / local SGD) and applies them.
        Returns whether this call stepped. With several models, `optimizer` (one setup() returned)
        says which steps: after one backward pass each model it reached steps once, in any order (a
        backbone and a head with their own optimizers), and `step()` with no optimizer steps all of
        them. A model's gradients that no step used are dropped when the next backward pass starts
        (as each model's own zero_grad() before its backward drops them in a plain loop)."""
        if optimizer is None and len(self.parts) > 1:
            return self._step_each()
        part = part_of(self.parts, self._part, optimizer)
        first = self.micro > 0
        if not first and (not self._stepped or part in self._stepped):
            raise ToolkitError("session.step() without a session.backward(loss) before it"
                               + (" (each optimizer steps once after a backward)" if self._stepped else ""))
        if first and self.micro < self.config.accumulation_steps:
            return False
        with self._using(part):
            self._finish_step(None)
        if first:                   # one optimizer step of the job, whichever models it steps
            self._stepped = []
            self.global_step += 1
        self._stepped.append(part)
        self.micro = 0
        self.guard.after_step(None)
        self.profile.after_step()
        return True

    def _step_each(self) -> bool:
        """`step()` with several models: each one the last backward pass reached, in setup() order."""
        if self.micro and self.micro < self.config.accumulation_steps:
            return False
        due = [p for p in self.parts if p not in self._stepped and self.has_gradients(p)]
        if self.micro == 0 or not due:
            raise ToolkitError("session.step() without a session.backward(loss) before it reached a model still "
                               "to step; name one with session.step(optimizer)")
        for part in due:
            self.step(part.optimizer)
        return True

    def _new_backward(self) -> None:
        """Before a backward pass that starts an optimizer step (several models): the gradients an
        earlier backward gave the models no step used are dropped (their reductions finished first)."""
        if self.micro == 0:
            self.profile.before_step()
        if self.micro == 0 and self._stepped:
            for other in self.parts:
                if other not in self._stepped:
                    with self._using(other):
                        self.strategy.discard(self)
            self._stepped = []

    def train_step(self, batches: Sequence[Any]) -> float:
        """One optimizer step on `accumulation_steps` micro-batches with the setup model and loss: the
        local mean loss (a host value; the built-in trainer's step). Batches `(x, y)` in every framework, or of
        any structure (adapters/batches.py: a dict, a triple, ...) in torch, Keras 3 and MXNet (not tf-keras)."""
        other = next((b for b in batches if not batches_module.is_pair(b)), None) if not self.any_batch else None
        if other is not None:
            raise ToolkitError(f"session.train_step(batches): {self.config.framework} takes (x, y) micro-batches, "
                               f"these are {batches_module.describe(other)}; write the step with "
                               "session.backward(loss) and session.step() instead")
        self.profile.before_step()
        loss = self._finish_step(batches)
        self.global_step += 1
        self.guard.after_step(loss)
        self.profile.after_step()
        return loss

    def _finish_step(self, batches):
        """One optimizer step's reduce and update, by the way the strategy chose once (its `exchange`):
        its own reduce (`_train_step` on `batches`, or `_apply_step` after the user's backward passes,
        `batches` None), or the toolkit's exchange of this rank's gradients. The local mean loss of
        `batches` (None after the user's backward passes)."""
        comm = self.communication
        if not comm.toolkit:
            comm.count_backend_step()
            if batches is None:
                self._apply_step()
                return None
            return self._train_step(batches)
        loss, grads = self.local_gradients(batches)
        norm = comm.exchange_and_apply(grads, self.global_step)
        if norm is not None:
            self.grad_norm = norm
        return loss

    @property
    def measures_norm(self) -> bool:
        """Whether a step computes the reduced gradient's norm (to clip it; also `grad_norm`)."""
        return self.config.clip_grad_norm is not None

    @property
    def reduces_loss(self) -> bool:
        """Whether a step also averages its loss over the ranks, in Horovod's cycle beside the
        gradients (nan_guard: one value every rank agrees on, so every rank stops at the same step)."""
        return self.config.nan_guard

    def autocast(self):
        """A context for the forward pass in the config's precision (torch: torch.autocast; Keras:
        its global mixed policy, set at start, so nothing here)."""
        return self.precision.forward_context() if self.precision is not None else contextlib.nullcontext()

    def _reduce_and_apply(self, loss, batch=None) -> None:
        """One optimizer step after the backward passes, in the order written once for every strategy
        and precision: reduce (strategy) -> unscale (precision) -> clip -> finite check, then apply or
        skip (precision). nan_guard: the step's loss averaged over the ranks beside the gradients.
        `batch`: what the framework's update divides by (MXNet's Trainer), None elsewhere."""
        pending = self.strategy.reduce_loss(self, loss) if self.reduces_loss else None
        self.strategy.reduce(self)
        self.precision.unscale(self.optimizer)
        if self.measures_norm:
            self.grad_norm = self._clip_gradients(self.config.clip_grad_norm, batch)  # type: ignore[arg-type]  # set: measures_norm
        with self.strategy.reduced(self):
            self.step_skipped = self.precision.step(self.optimizer, batch)
        if self.reduces_loss:
            self.step_loss = self.strategy.reduced_loss(self, pending, loss)

    def lr(self, step: int, steps_per_epoch: int) -> float:
        """The config's learning rate at optimizer `step`: scaled by world size, linear warm-up."""
        return schedule.lr_at(self.config, self.world_size, step, steps_per_epoch)

    # -- measuring --------------------------------------------------------------------------------------
    def evaluate(self, loader: Loader, collective: bool = True,
                 metric: Callable | None = None) -> tuple[float, float | None]:
        """(mean loss, accuracy) of the setup model over every rank's share of `loader`'s data (a
        collective). Batches `(x, y)`: the setup loss, and accuracy as argmax of 2-D outputs against
        integer labels (else None). Other batches (dicts, more fields): `metric(model, batch)` returns
        the batch's mean loss, or (mean loss, number correct); it runs as inference (torch: no_grad,
        the config's autocast); without a metric, torch's is the loss the step trains with (no accuracy).
        `collective=False`: this rank's own model on what its loader holds, nothing exchanged (a parameter-server worker's view between epochs)."""
        import numpy as np
        if collective:
            self.sync_buffers()
        self._train_mode(False)
        totals = np.zeros(4, np.float64)          # loss sum, correct, count, batches without accuracy
        for batches in loader.steps():
            for batch in batches:
                totals += self._evaluate_one(batch, metric)
        self._train_mode(True)
        loss_sum, correct, count, no_accuracy = (self.allreduce(totals, average=False, name="toolkit.evaluate")
                                                 if collective else totals)
        if not count:
            return float("nan"), None
        return loss_sum / count, (None if no_accuracy else correct / count)

    def _evaluate_one(self, batch, metric):
        import numpy as np
        if metric is None and batches_module.is_pair(batch):
            return self._evaluate_batch(*batch)
        if metric is None and not self.any_batch:
            raise ToolkitError(f"session.evaluate(loader): its batches are {batches_module.describe(batch)}, "
                               "not (x, y); pass metric=fn(model, batch) returning the batch's mean loss (or "
                               "(loss, correct))")
        if metric is None:      # the loss the step trains with (adapters/batches.py), no accuracy
            metric = lambda model, batch: batches_module.loss_of(self, batch)   # noqa: E731
        with self._inference(), self.autocast():
            result = metric(self.model, batch)
        loss, correct = result if isinstance(result, (tuple, list)) else (result, None)
        n = leading_size(batch)
        return np.array([self.to_float(loss) * n, 0 if correct is None else self.to_float(correct), n,
                         correct is None], np.float64)

    def sync_buffers(self) -> None:
        """Statistics the model keeps outside its parameters (BatchNorm's running mean and variance)
        drift apart on ranks that saw different batches: averaged over the ranks (a collective,
        also run by evaluate(), save() and check_replicas(), so replicas end identical). Settles
        the NaN guard's last check first: nothing is measured or saved from a broken step."""
        import numpy as np
        self.guard.settle()
        if self.size == 1 and self.replicas == 1:     # a process's several replicas (MirroredStrategy) also drift
            return
        for i, part in enumerate(self.parts or [self._part]):
            with self._using(part):
                buffers = self._buffers()
                if not buffers:
                    continue
                from toolkit.exchange.arrays import flatten, unflatten
                arrays = [np.asarray(b, np.float64) for b in buffers]
                name = "toolkit.buffers" if i == 0 else f"toolkit.buffers.{i}"
                flat = self.allreduce(flatten(arrays), average=True, name=name)
                self._set_buffers(unflatten(flat, arrays))

    def should_stop(self) -> bool:
        """Whether any rank was sent SIGTERM (or called toolkit.run.preemption.request()): the same answer
        on every rank, at the same step. A collective: call it once per step on every rank; then
        save() and exit with toolkit.run.preemption.EXIT_CODE (the built-in trainer does)."""
        if self.size == 1:
            return preemption.requested()
        return self.mean(1.0 if preemption.requested() else 0.0, name="toolkit.should_stop") > 0

    def mean(self, value: float, name: str) -> float:
        """`value` averaged over the ranks (a collective: every rank calls it with the same name)."""
        import numpy as np
        return float(self.allreduce(np.array([value], np.float64), name=name)[0])

    def replica_digests(self, name: str = "toolkit.final_digest") -> list[str]:
        """Every replica's parameter digest, in replica order, on every rank (a collective)."""
        mine = [digest(p) for p in self.replica_parameters()]
        return [d for per_rank in self.allgather_object(mine, name=name) for d in per_rank]

    def check_replicas(self) -> list[str]:
        """Every replica's final digest (a collective); a mismatch stops the job (exit 1) on every rank."""
        self.sync_buffers()
        digests = self.replica_digests("toolkit.final_digest")
        if len(set(digests)) != 1:
            raise ToolkitError("replica check failed: replicas ended with different parameters "
                               f"(digests by replica: {digests}); this is a bug: report it with what docs/SUPPORT.md "
                               "lists (`toolkit --version`, `toolkit doctor --framework all`, the command)", code=1)
        return digests

    def log(self, step: int, values: dict) -> None:
        """Rank 0: one line of metrics to metrics.jsonl, TensorBoard, W&B and MLflow (as the config says)."""
        writers = self.open_log()
        if writers is not None:
            writers.write(step, values)

    def open_log(self) -> MetricsLog | None:
        """Rank 0, where the config names a writer: the metrics writers, opened (MLflow's run started, or the
        checkpoint's continued) if not yet; None elsewhere."""
        from toolkit.run import metrics
        if not self.is_main or not metrics.wanted(self.config):
            return None
        if self._metrics is None:
            self._metrics = metrics.MetricsLog(self.config, self.mlflow_run_id, self.rank)
        return self._metrics

    def tracking_state(self) -> dict:
        """Rank 0: what a checkpoint keeps of its trackers, the id of its MLflow run (opened now where a user's
        loop saves before its first log, so that a resume continues the same run)."""
        writers = self.open_log()
        mlflow = writers.mlflow if writers is not None else None
        return {"mlflow_run_id": mlflow.run_id} if mlflow is not None else {}

    def close(self, summary: dict | None = None) -> None:
        """The end of training: the profile, the last async checkpoint and the metrics writers finished;
        `summary` (the built-in script's JSON summary) kept by the trackers that keep one (MLflow's run)."""
        self.profile.close()        # a run that ended inside profile_steps: its trace as far as it went
        self.checkpoints.finish()   # checkpoint_async: the last save written
        self._new_backward()        # several models: reductions no step waited for, finished
        if summary is not None:
            self.open_log()
        if self._metrics is not None:
            self._metrics.close(summary)
            self._metrics = None

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, directory: str | None = None, **progress) -> Path | None:
        """A checkpoint of the setup model and optimizer, the loaders' positions, the exchange's
        residuals and `progress` (JSON values, e.g. epoch=3), as `ckpt-<step>/` in `directory`
        (default: checkpoint_dir): written by rank 0 atomically with a sha256 of every file; the
        last keep_checkpoints are kept. A collective: every rank calls it."""
        return self.checkpoints.save(directory, progress)

    def on_main(self, action, name: str):
        """`action()` on rank 0 alone; its one-line ToolkitError (a folder it cannot write) stops every
        rank with that line. Returns its result on rank 0, None elsewhere. A collective, except under
        elastic training (rank 0 raises alone; Horovod elastic stops the others)."""
        result, error = None, None
        if self.is_main:
            try:
                result = action()
            except ToolkitError as e:
                error = str(e)
        if self.size > 1 and not self.config.elastic:
            error = self.broadcast_object(error, name=name)
        if error:
            raise ToolkitError(error)
        return result

    def load(self, directory: str | None = None, collective: bool = True) -> dict:
        """The newest checkpoint in `directory` (default: checkpoint_dir): rank 0 verifies and loads
        it, then every rank gets its model, optimizer state, loader positions and exchange state;
        returns the saved progress (`step`, and what save() was given). A bad checkpoint stops every
        rank with the same one line. Elastic training (`collective=False`) runs no collective
        before hvd.elastic.run: rank 0 loads alone and the elastic state's sync shares it."""
        return self.checkpoints.load(directory, collective)

    # -- collectives: the strategy's ------------------------------------------------------------------
    # Object collectives always carry a name: Horovod names them after type(obj) unless told, and
    # ranks passing objects of different types (rank 0 a payload, the others None) would wait forever.
    def allgather_object(self, obj, name: str) -> list:
        return self.strategy.allgather_object(obj, name=name)

    def broadcast_object(self, obj, name: str, root: int = 0):
        return self.strategy.broadcast_object(obj, name=name, root=root)

    def allreduce(self, array, average: bool = True, name: str | None = None, group=None):
        """numpy array in, numpy array out, summed or averaged over ranks (`group`'s: strategy.new_group).
        Horovod names an unnamed collective by a per-process counter, so ranks that ran different numbers
        of operations (uneven data, joined ranks) must name theirs."""
        return self.strategy.allreduce(array, average=average, name=name, group=group)

    def allgather(self, array, group=None):
        """1-D numpy array in (any length per rank), the ranks' arrays concatenated in rank order out."""
        return self.strategy.allgather(array, group=group)

    def alltoall(self, array, splits: list[int], group=None):
        """1-D array in, part j (splits[j] values) to rank j; the parts every rank sent this one, in rank order."""
        return self.strategy.alltoall(array, splits, group=group)

    def broadcast(self, root: int = 0) -> None:
        """Every model (parameters and buffers) and optimizer state from rank `root` to every rank."""
        for part in self.parts:
            with self._using(part):
                self.strategy.broadcast(self, root)

    def join(self) -> int:
        """Horovod's join: this rank has no more batches; its allreduces count as zeros until
        every rank has joined. Returns the last rank to join."""
        return self.strategy.join()

    def elastic_run(self, func):
        """`func(state)` under the strategy's elastic run (Horovod's `hvd.elastic.run`)."""
        return self.strategy.elastic_run(func)

    def on_reset(self) -> None:
        """After Horovod re-formed the job with other workers (hvd.shutdown + hvd.init)."""
        self.strategy.on_reset(self)
