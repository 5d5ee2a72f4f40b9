"""Parameter-server training over mpi4py: `sync: async_ps` (fully asynchronous) and `sync: ssp`
(stale-synchronous, no worker more than `staleness` steps ahead of the slowest).

Ranks 0 .. ps_servers-1 are servers, the rest are workers. The parameters, flattened to one float32
vector, are cut into one contiguous shard per server; a server holds its shard and the optimizer's
state for it and applies every gradient as it arrives, with the configured optimizer (numpy, the
update rules of torch.optim.SGD / Adam). A worker computes gradients with its framework
(`session.local_gradients`), pushes one shard to each server and pulls back the new values, point to
point (MPI Send/Recv on numpy buffers) with no barrier. Under SSP a server holds a worker's reply
until the slowest worker is at most `staleness` steps behind it. Written once here for every
framework; a session only provides `local_gradients`, `weights` and `set_weights`.

Workers run Horovod on their own communicator (`hvd.init(comm=...)`, an mpi4py split of
COMM_WORLD) for evaluation and the final replica check; servers need no framework at all.

Staleness is recorded two ways: per update, how many updates the server applied between the
worker's read and its gradient (`staleness`), and per reply, how many steps the worker is ahead
of the slowest worker when it goes on (`clock_gap`, which SSP bounds by `staleness`).
"""
from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import numpy as np

from toolkit.config import Config, Dataset, Optimizer, Sync
from toolkit.data import datasets, sampler
from toolkit.errors import ToolkitError
from toolkit.exchange import numerics
from toolkit.exchange.arrays import flatten, unflatten
from toolkit.messages import print_error, say
from toolkit.run import checkpoint, schedule

# message tags (a header of int64 values is followed, for PUSH and replies, by a float32 payload)
HEADER, DATA, STATS = 1, 2, 3
# header kinds
INIT, PUSH, DONE = 0, 1, 2
SHARD_FILE = "shard.npz"


def split(length: int, servers: int) -> list[tuple[int, int]]:
    """(start, stop) of each server's shard of a flat vector of `length` values."""
    edges = np.linspace(0, length, servers + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def bound(config: Config) -> int | None:
    """The most steps a worker may run ahead of the slowest; None = unbounded (async)."""
    return config.staleness if config.sync is Sync.SSP else None


class ServerOptimizer:
    """The configured optimizer on one shard, with torch.optim's update rules (coupled L2)."""

    def __init__(self, config: Config, size: int):
        self.config = config
        self.slots = {"momentum": np.zeros(size, np.float32)} if config.optimizer is Optimizer.SGD else \
            {"m": np.zeros(size, np.float32), "v": np.zeros(size, np.float32)}
        self.t = 0

    def step(self, params: np.ndarray, grad: np.ndarray, lr: float) -> None:
        c = self.config
        g = grad + c.weight_decay * params if c.weight_decay else grad
        self.t += 1
        if c.optimizer is Optimizer.SGD:
            buf = self.slots["momentum"]
            if c.momentum:
                buf[:] = g if self.t == 1 else c.momentum * buf + g
                g = buf
            params -= lr * g
        else:
            b1, b2, eps = 0.9, 0.999, 1e-8
            m, v = self.slots["m"], self.slots["v"]
            m[:] = b1 * m + (1 - b1) * g
            v[:] = b2 * v + (1 - b2) * g * g
            step = lr / (1 - b1 ** self.t)
            params -= step * m / (np.sqrt(v / (1 - b2 ** self.t)) + eps)


class Server:
    def __init__(self, config: Config, world, index: int, servers: int, n_train: int):
        self.config, self.world, self.index = config, world, index
        self.workers = list(range(servers, world.Get_size()))
        b, k = config.batch_size, config.accumulation_steps
        self.steps_per_epoch = sampler.steps_per_epoch(n_train, len(self.workers), b, k)
        self.updates_per_epoch = self.steps_per_epoch * len(self.workers)
        self.updates_per_sample_epoch = n_train // (b * k)      # lr warm-up counts samples, as sync does
        self.bound = bound(config)
        self.params: np.ndarray = None              # type: ignore[assignment]  # set by serve() before use
        self.optimizer: ServerOptimizer = None      # type: ignore[assignment]  # set by serve() before use
        self.version = 0                # updates applied to this shard
        self.staleness: collections.Counter[int] = collections.Counter()
        self.clock_gaps: collections.Counter[int] = collections.Counter()
        self.folder = Path(config.checkpoint_dir) / f"server-{index}" if config.checkpoint_dir else None

    # -- state: from worker 0's initial weights, or from this server's checkpoint --------------------
    def _load(self, servers) -> None:
        """This shard from the newest step every server has a checkpoint of (`servers`: their
        communicator), so the shards put back together are one model."""
        found = {int(p.name[len(checkpoint.PREFIX):]): p
                 for p in checkpoint.all_checkpoints(self.folder)}  # type: ignore[arg-type]  # resume: a checkpoint_dir
        common = set.intersection(*servers.allgather(set(found)))
        if not common:
            raise ToolkitError(f"--resume: no step has a checkpoint from every server in {self.config.checkpoint_dir}"
                               f"/server-*; run without --resume, or with the ps_servers of the run that wrote them")
        path = found[max(common)]
        meta = checkpoint.verify(path)
        arrays = np.load(path / SHARD_FILE)
        self.params = arrays["params"].copy()
        self.optimizer = ServerOptimizer(self.config, self.params.size)
        for name in self.optimizer.slots:
            self.optimizer.slots[name][:] = arrays[name]
        self.optimizer.t = int(meta["optimizer_t"])
        self.version = int(meta["step"])

    def _save(self) -> None:
        def write(folder: Path) -> None:
            np.savez(folder / SHARD_FILE, params=self.params, **self.optimizer.slots)
        checkpoint.save(self.folder, self.version,  # type: ignore[arg-type]  # called only with a folder
                        {"epoch": self.version // self.updates_per_epoch, "optimizer_t": self.optimizer.t}, write,
                        keep=self.config.keep_checkpoints)

    def _recv_header(self):
        from mpi4py import MPI
        status = MPI.Status()
        header = np.empty(3, np.int64)
        self.world.Recv(header, source=MPI.ANY_SOURCE, tag=HEADER, status=status)
        return status.Get_source(), header

    def _reply(self, worker: int) -> None:
        self.world.Send(np.array([self.version, self.version // self.updates_per_epoch, 0], np.int64),
                        dest=worker, tag=HEADER)
        self.world.Send(self.params, dest=worker, tag=DATA)

    def serve(self, servers) -> dict:
        c = self.config
        if c.resume:
            self._load(servers)
        else:
            source, header = self._recv_header()     # worker 0 sends the initial weights
            assert header[0] == INIT and source == self.workers[0], f"expected INIT from worker 0, got {header}"
            self.params = np.empty(int(header[1]), np.float32)
            self.world.Recv(self.params, source=source, tag=DATA)
            self.optimizer = ServerOptimizer(c, self.params.size)
        for w in self.workers:
            self._reply(w)
        clocks = {w: 0 for w in self.workers}
        active, waiting = set(self.workers), {}
        while active:
            source, header = self._recv_header()
            if header[0] == DONE:
                active.discard(source)
            else:
                grad = np.empty_like(self.params)
                self.world.Recv(grad, source=source, tag=DATA)
                stale = self.version - int(header[2])
                self.staleness[stale] += 1
                lr = schedule.lr_at(c, 1, self.version, self.updates_per_sample_epoch)
                if c.staleness_lr_damping and stale > 0:
                    lr /= stale + 1         # staleness-aware lr (Zhang et al. 2016)
                self.optimizer.step(self.params, grad, lr)
                self.version += 1
                clocks[source] = int(header[1]) + 1
                waiting[source] = clocks[source]
                if self.folder and self.version % self.updates_per_epoch == 0:
                    self._save()
            slowest = min((clocks[w] for w in active), default=None)
            for w in sorted(waiting):
                gap = waiting[w] - slowest if slowest is not None else 0
                if self.bound is None or gap <= self.bound:
                    self.clock_gaps[max(gap, 0)] += 1
                    self._reply(w)
                    del waiting[w]
        for w in self.workers:          # everyone's final model: the same on every worker
            self._reply(w)
        stats = {"updates": self.version, "staleness": dict(self.staleness), "clock_gap": dict(self.clock_gaps)}
        self.world.send(stats, dest=self.workers[0], tag=STATS)
        return stats


class Client:
    """A worker's side: push a gradient to every server, pull every shard back."""

    def __init__(self, world, servers: int, like: list):
        self.world, self.servers, self.like = world, servers, like
        self.length = sum(int(np.size(a)) for a in like)
        self.shards = split(self.length, servers)
        self.versions = [0] * servers
        self.flat = np.empty(self.length, np.float32)
        self.epoch = 0

    def send_initial(self, weights) -> None:
        flat = flatten(weights)
        for s, (a, b) in enumerate(self.shards):
            self.world.Send(np.array([INIT, b - a, 0], np.int64), dest=s, tag=HEADER)
            self.world.Send(np.ascontiguousarray(flat[a:b]), dest=s, tag=DATA)

    def _receive(self) -> list:
        """Post a receive for every server's reply (header, then its shard into self.flat)."""
        self.headers = [np.empty(3, np.int64) for _ in self.shards]
        requests = []
        for s, (a, b) in enumerate(self.shards):
            requests.append(self.world.Irecv(self.headers[s], source=s, tag=HEADER))
            requests.append(self.world.Irecv(self.flat[a:b], source=s, tag=DATA))
        return requests

    def _received(self) -> list:
        for s, header in enumerate(self.headers):
            self.versions[s], self.epoch = int(header[0]), int(header[1])
        return unflatten(self.flat, self.like)

    def pull(self) -> list:
        from mpi4py import MPI
        MPI.Request.Waitall(self._receive())
        return self._received()

    def push_pull(self, grads, clock: int) -> list:
        """Push this step's gradient to every server and take the new parameters back. The replies'
        receives are posted before the sends: a server blocked sending to this worker must never
        wait on a worker blocked sending to it (with two servers that cycle deadlocks)."""
        from mpi4py import MPI
        requests = self._receive()
        flat = flatten(grads)
        for s, (a, b) in enumerate(self.shards):
            requests.append(self.world.Isend(np.array([PUSH, clock, self.versions[s]], np.int64), dest=s, tag=HEADER))
            requests.append(self.world.Isend(flat[a:b], dest=s, tag=DATA))
        MPI.Request.Waitall(requests)
        return self._received()

    def done(self, clock: int) -> None:
        for s in range(self.servers):
            self.world.Send(np.array([DONE, clock, 0], np.int64), dest=s, tag=HEADER)

    def stats(self) -> dict:
        """Every server's statistics, merged (worker 0 only)."""
        merged: dict = {"updates": 0, "staleness": collections.Counter(), "clock_gap": collections.Counter()}
        for s in range(self.servers):
            part = self.world.recv(source=s, tag=STATS)
            merged["updates"] = max(merged["updates"], part["updates"])
            merged["staleness"].update(part["staleness"])
            merged["clock_gap"].update(part["clock_gap"])
        return merged


# Set in each process an MPI launcher starts (Open MPI's mpirun, Hydra/PMI, PMIx under srun).
MPI_LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def _world():
    """MPI.COMM_WORLD, or a one-line error when this process was not started by MPI. A Horovod rank that no MPI
    launcher started is refused before MPI initializes: a singleton MPI_Init would start Open MPI's daemon, which
    prints its own error when the process exits with this one."""
    import os
    if "HOROVOD_RANK" in os.environ and not any(k in os.environ for k in MPI_LAUNCHED):
        raise ToolkitError("sync=async_ps/ssp talks through MPI and this job was started over Gloo; launch with "
                           "mpirun, `horovodrun --mpi` or `toolkit launch --mpi`")
    try:
        from mpi4py import MPI
    except ImportError:
        from toolkit.install import support
        raise ToolkitError(f"sync=async_ps/ssp needs mpi4py: {support.install_fix('mpi4py')}") from None
    return MPI.COMM_WORLD


def summarize(stats: dict) -> dict:
    """The JSON summary's staleness figures from merged server statistics."""
    stale, gaps = stats["staleness"], stats["clock_gap"]
    n = sum(stale.values())
    return {"updates": stats["updates"],
            "staleness_mean": sum(k * v for k, v in stale.items()) / n if n else 0.0,
            "staleness_max": max(stale, default=0),
            "staleness_histogram": {str(k): stale[k] for k in sorted(stale)},
            "clock_gap_max": max(gaps, default=0),
            "clock_gap_histogram": {str(k): gaps[k] for k in sorted(gaps)}}


def run(config: Config) -> dict:
    """Every rank of a parameter-server job calls this (from toolkit.run.trainer.run)."""
    from toolkit.run import pipeline

    world = _world()
    servers: int                # ps_servers is set for the parameter-server syncs (toolkit/config/derived.py)
    size, rank, servers = world.Get_size(), world.Get_rank(), config.ps_servers  # type: ignore[assignment]
    if config.checkpoint_dir and not config.resume:
        checkpoint.refuse_reuse(config.checkpoint_dir)      # every rank, before any message
    if size <= servers:
        raise ToolkitError(f"ps_servers={servers} but the job has {size} rank(s): at least one worker is needed; "
                           f"launch {servers + 1} or more ranks (mpirun -np {servers + 1}) or lower ps_servers")
    if config.dataset not in {d.value for d in Dataset}:
        raise ToolkitError(f"dataset={config.dataset!r}: the parameter server trains the built-in datasets (digits, "
                           "synthetic); use sync every_step or local_sgd for your own")
    data = datasets.load(config)
    n_train = len(data.x_train)
    if sampler.steps_per_epoch(n_train, size - servers, config.batch_size, config.accumulation_steps) < 1:
        raise ToolkitError(f"batch_size={config.batch_size} x accumulation_steps={config.accumulation_steps} x "
                           f"{size - servers} workers is more than the {n_train} training samples; lower batch_size")
    delay = config.straggler_delays().get(rank, 0.0)
    fraction = config.data_fractions().get(rank, 1.0)       # uneven_data: this worker's share of its batches
    group = world.Split(color=0 if rank < servers else 1, key=rank)
    if rank < servers:
        Server(config, world, rank, servers, n_train).serve(group)
        return {"rank": None}

    session = pipeline.start(config, comm=group)      # Horovod among the workers only
    w, workers = session.rank, session.size
    both = datasets.datasets(config, session)
    # the same rule as synchronous training for this worker's share
    initial_digests, train_loader, eval_loader = pipeline.prepare(config, session, both)
    # worker 0's own view each epoch: the whole test set on its copy of the model, no collective
    own_eval = session.loader(both.eval, batch_size=config.batch_size, train=False, shard=False)
    client = Client(world, servers, session.weights())
    session.on_main(lambda: pipeline.write_config(config), name="toolkit.config_written")
    if w == 0 and not config.resume:
        client.send_initial(session.weights())
    session.set_weights(client.pull())
    start = client.versions[0]          # updates the servers had applied before this job (resume)
    b, k = config.batch_size, config.accumulation_steps
    spe = train_loader.steps_per_epoch
    how = f"ssp, staleness {config.staleness}" if config.sync is Sync.SSP else "async"
    say(w, f"{config.framework}/parameter server ({how}): {servers} server(s), {workers} worker(s), "
            f"{spe} steps/epoch per worker, batch {b * k} per update", config.quiet)
    losses: list[float]
    clock, losses, loss, t0 = 0, [], None, time.perf_counter()
    pushed, replied = [], []            # wall-clock times of each push and of its reply (the step log)
    for epoch in range(client.epoch, config.epochs):
        train_loader.set_epoch(epoch)
        losses = []
        for s, batches in enumerate(train_loader.steps()):
            if s >= int(spe * fraction):
                break
            if delay:
                time.sleep(delay)
            step_loss, grads = session.local_gradients(batches)
            losses.append(session.to_float(step_loss))
            if config.nan_guard:    # this worker's own loss (the server applies gradients as they come)
                _check_or_abort(world, clock + 1, losses[-1])
            pushed.append(time.time())
            session.set_weights(client.push_pull(grads, clock))
            replied.append(time.time())
            clock += 1
        loss = float(np.mean(losses))
        if w == 0:      # this worker's view (the others are at most `staleness` steps apart)
            test_loss, accuracy = session.evaluate(own_eval, collective=False)
            say(w, f"epoch {epoch + 1}/{config.epochs}  loss {loss:.4f}  test_loss {test_loss:.4f}  "
                    f"accuracy {accuracy:.4f}  (worker 0: its own loss and its copy of the model)", config.quiet)
    client.done(clock)
    session.set_weights(client.pull())          # the servers' final parameters
    seconds = time.perf_counter() - t0
    stats = summarize(client.stats()) if w == 0 else {}
    loss = session.mean(loss if loss is not None else np.nan, name="toolkit.ps_loss")
    _, accuracy = session.evaluate(eval_loader)
    # what the JSON summary says, unlike the epoch lines: every worker's, on the servers' final model
    say(w, f"final  loss {loss:.4f} (every worker's last epoch)  accuracy {accuracy:.4f} (the servers' final "
            f"model, every worker's share of the test set)", config.quiet)
    digests = session.check_replicas()
    trained = [int(n) for n in session.allgather_object(clock, name="toolkit.steps_trained")]
    if config.log_dir:      # each worker's step log: when it pushed each gradient and got the reply
        Path(config.log_dir).mkdir(parents=True, exist_ok=True)
        (Path(config.log_dir) / f"ps-worker-{w}.json").write_text(json.dumps({"push": pushed, "reply": replied}))
    samples = float(session.allreduce(np.array([clock * b * k], np.float64), average=False, name="toolkit.ps_samples")[0])
    return pipeline.summary(
        config, session, world_size=workers, processes=size,
        path=f"parameter server over mpi4py ({servers} server(s), {how})", steps=client.versions[0],
        final_loss=loss, accuracy=accuracy, start_step=start, steps_trained=trained, digests=digests,
        initial_digests=initial_digests, lr=schedule.lr_at(config, 1, client.versions[0], n_train // (b * k)),
        samples_per_sec=samples / seconds if seconds else 0.0,
        details={"staleness_bound": bound(config), "servers": servers, **stats})


def _check_or_abort(world, step: int, loss: float) -> None:
    """A non-finite loss stops the whole job: its line, then MPI_Abort (the servers and the other
    workers wait in messages, and a plain exit would leave them waiting in MPI_Finalize)."""
    try:
        numerics.check(step, loss, "loss")
    except ToolkitError as e:
        print_error(e)
        world.Abort(e.code)
