"""The training loop, written once for every framework: it drives an adapter (adapters/base.py).

Every rank runs this. Rank 0 alone logs, writes checkpoints, the resolved config and the final
JSON summary; before the summary every rank's parameter digest is gathered and compared.
"""
from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
import types
from pathlib import Path

from toolkit import checkpoint, data as datasets, metrics as metrics_log, registry, schedule
from toolkit.communication import Communication
from toolkit.config import PS_SYNCS, Config
from toolkit.errors import ToolkitError


def digest(arrays) -> str:
    """sha256 of the parameters' bytes: equal on two ranks only if every bit is equal."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _log(rank: int, message: str, quiet: bool = False) -> None:
    if rank == 0 and not quiet:
        sys.stderr.write(message + "\n")      # one write: mpirun --tag-output tags each chunk it reads
        sys.stderr.flush()


def _progress_bar(config: Config, rank: int, epoch: int, steps: int, done: int):
    """Rank 0's tqdm bar for one epoch, only on a terminal and without `quiet` (logs stay clean)."""
    if rank != 0 or config.quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=steps, initial=done, desc=f"epoch {epoch + 1}/{config.epochs}", unit="step",
                leave=False, file=sys.stderr, dynamic_ncols=True)


def _restore(adapter, comm: Communication, config: Config, rank: int, collective: bool = True) -> dict:
    """Rank 0 verifies and loads the latest checkpoint; every rank learns the outcome, so a bad
    checkpoint stops all ranks with the same message instead of leaving them in a collective.
    Every rank takes its own error-feedback residual from what rank 0 read. Without `resume`,
    rank 0 only checks that checkpoint_dir holds no earlier run (nothing is overwritten).

    Elastic training (`collective=False`) runs no collective before hvd.elastic.run: rank 0 loads
    alone and the elastic state's sync hands its model and progress to the others."""
    if not config.checkpoint_dir:
        return {}
    outcome = {}
    if rank == 0:
        try:
            if not config.resume:
                checkpoint.refuse_reuse(config.checkpoint_dir)
                raise _Fresh
            path, meta = checkpoint.latest(config.checkpoint_dir)
            try:
                adapter.load(path)
                saved_comm = comm.read(path)
            except Exception as e:  # the framework's own reader failed: name the file, not a traceback
                raise ToolkitError(f"checkpoint {path} cannot be loaded ({e.__class__.__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}); move it out of the "
                                   f"folder to resume from the one before") from None
            outcome = {"meta": meta, "path": str(path), "communication": saved_comm}
        except _Fresh:
            outcome = {"fresh": True}
        except ToolkitError as e:
            if not collective:
                raise
            outcome = {"error": str(e)}
    if not collective and not config.resume:
        return {}
    if not collective:
        if rank == 0:
            _log(rank, f"resumed from {outcome['path']} (step {outcome['meta']['step']})")
        return outcome.get("meta", {})
    outcome = adapter.broadcast_object(outcome, name="toolkit.resume")
    if "error" in outcome:
        raise ToolkitError(outcome["error"])
    if "fresh" in outcome:
        return {}
    _log(rank, f"resumed from {outcome['path']} (step {outcome['meta']['step']})")
    note = comm.load(outcome["communication"])
    if note:
        _log(rank, f"warning: {note}")
    return outcome["meta"]


class _Fresh(Exception):
    """Rank 0 found checkpoint_dir free for a new run."""


def _replica_digests(adapter, name: str) -> list[str]:
    """Every replica's parameter digest, in replica order, on every rank."""
    mine = [digest(p) for p in adapter.replica_parameters()]
    return [d for per_rank in adapter.allgather_object(mine, name=name) for d in per_rank]


def check_replicas(adapter) -> list[str]:
    """Every replica's final digest (a collective); a mismatch stops the job (exit 1) on every rank."""
    digests = _replica_digests(adapter, "toolkit.final_digest")
    if len(set(digests)) != 1:
        raise ToolkitError("replica check failed: replicas ended with different parameters "
                           f"(digests by replica: {digests}); this is a bug, please report it", code=1)
    return digests


def _evaluate(adapter, x, y) -> tuple[float, float]:
    """(mean test loss, accuracy) over every rank's share of the test set."""
    import numpy as np

    loss_sum, correct, count = adapter.allreduce(np.array(adapter.evaluate(x, y), dtype=np.float64),
                                                 average=False, name="toolkit.evaluate")
    return loss_sum / count, correct / count


def _current(adapter, topo):
    """The topology now: Horovod elastic renumbers the ranks after workers leave or join."""
    hvd = adapter.hvd
    return dataclasses.replace(topo, rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                               local_size=hvd.local_size())


def run(config: Config) -> dict:
    import numpy as np

    metrics_log.check(config)
    if config.sync in PS_SYNCS:         # a parameter server job: its own loop (toolkit/ps.py)
        from toolkit import ps
        return ps.run(config)
    adapter = registry.load(config.framework, config.backend.value, config.keras.value)()
    topo = adapter.init(config)
    rank = topo.rank
    data = datasets.load(config)
    adapter.build(config, data.num_features, data.num_classes)
    # Elastic: no collective before hvd.elastic.run, where a worker that joins later (this script
    # from the top) meets the others in the state's sync.
    initial_digests = ([digest(p) for p in adapter.replica_parameters()] if config.elastic
                       else _replica_digests(adapter, "toolkit.initial_digest"))
    adapter.wrap(config)
    comm = Communication(config, adapter, rank, topo.world_size)
    meta = _restore(adapter, comm, config, rank, collective=not config.elastic)
    if not config.elastic:
        adapter.broadcast()

    if rank == 0:
        for folder in filter(None, (config.checkpoint_dir, config.log_dir)):
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "config.yaml").write_text(config.to_yaml())
    n_train = len(data.x_train)
    b, k = config.batch_size, config.accumulation_steps
    delays, fractions = config.straggler_delays(), config.data_fractions()
    metrics = None
    # What a failure rolls back to and a new worker receives (elastic), or just the loop's counters.
    progress = dict(epoch=int(meta.get("epoch", 0)), position=0, step=int(meta.get("step", 0)),
                    loss=meta.get("train_loss"), accuracy=None, lr=None, samples=0, seconds=0.0,
                    epoch_loss=(0.0, 0), world_sizes=[], resets=0, trained=0)

    def train(state) -> None:
        nonlocal metrics
        if config.elastic:   # the world may have changed since the last call
            t = _current(adapter, topo)
            rank, size, replicas_per_rank = t.rank, t.size, t.replicas
        else:
            rank, size, replicas_per_rank = topo.rank, topo.size, topo.replicas
        # Data parallelism counts replicas: one per rank under Horovod, several per process under
        # TensorFlow's mirrored strategies. Replica r of the job gets shard r, as rank r would.
        world = size * replicas_per_rank
        replicas = range(rank * replicas_per_rank, (rank + 1) * replicas_per_rank)
        spe = datasets.steps_left(n_train, 0, world, b, k)
        if spe < 1:
            raise ToolkitError(f"batch_size={b} x accumulation_steps={k} x {world} replicas is more than the "
                               f"{n_train} training samples; lower batch_size")
        if config.elastic and state.world_sizes:    # called again: Horovod re-formed the job
            state.resets += 1
        if state.world_sizes[-1:] != [world]:
            state.world_sizes = state.world_sizes + [world]
            _log(rank, f"{config.framework}/{config.backend.value}: {size} rank(s) x {replicas_per_rank} "
                       f"replica(s) on {topo.device}, {spe} steps/epoch, global batch {b * k * world}", config.quiet)
        test_x, test_y = data.x_test[rank::size], data.y_test[rank::size]
        if metrics is None and rank == 0 and (config.log_dir or config.wandb_project):
            metrics = metrics_log.MetricsLog(config)
        delay = delays.get(rank, 0.0)
        my_steps = int(spe * fractions.get(rank, 1.0))      # uneven_data: this rank's batches per epoch
        while state.epoch < config.epochs:
            epoch = state.epoch
            order = datasets.epoch_order(n_train, epoch, config.seed)
            t0, done = time.perf_counter(), 0
            bar = _progress_bar(config, rank, epoch, spe, state.position // (b * k * world))
            while datasets.steps_left(n_train, state.position, world, b, k):
                if state.position // (b * k * world) >= my_steps:   # out of data: the others go on
                    state.step, state.position = state.step + 1, state.position + b * k * world
                    continue
                adapter.set_lr(lr := schedule.lr_at(config, world, state.step, spe))
                if delay:
                    time.sleep(delay)
                micro = datasets.step_indices(order, state.position, b, k, world, replicas)
                loss = comm.step([(data.x_train[idx], data.y_train[idx]) for idx in micro], state.step)
                state.trained += 1      # optimizer steps this rank computed in this process
                state.epoch_loss = (state.epoch_loss[0] + loss, state.epoch_loss[1] + 1)
                state.step, state.position, state.lr, done = state.step + 1, state.position + b * k * world, lr, done + 1
                if bar:
                    rate = done * b * k * world / (time.perf_counter() - t0)
                    bar.set_postfix_str(f"loss {loss:.4f}, {rate:,.0f} samples/s", refresh=False)
                    bar.update(1)
                if config.elastic and state.step % config.elastic_commit_every == 0:
                    state.commit()
            if bar:
                bar.close()
            if fractions:   # ranks that ran out joined: the last one has every step; its model for all
                adapter.broadcast(root=adapter.join())
            comm.end_epoch()
            state.seconds += time.perf_counter() - t0
            state.samples += done * b * k * world
            total, count = state.epoch_loss
            mean = np.array([total / count if count else np.nan], dtype=np.float64)
            state.loss = loss = float(adapter.allreduce(mean, name="toolkit.epoch_loss")[0])
            test_loss, state.accuracy = _evaluate(adapter, test_x, test_y)
            speed = state.samples / state.seconds if state.seconds else 0.0
            lr = state.lr if state.lr is not None else schedule.lr_at(config, world, state.step, spe)
            on = f"  on {world}" if config.elastic else ""
            _log(rank, f"epoch {epoch + 1}/{config.epochs}  loss {loss:.4f}  test_loss {test_loss:.4f}  "
                       f"accuracy {state.accuracy:.4f}  lr {lr:.4g}  {speed:,.0f} samples/s{on}", config.quiet)
            if metrics:
                metrics.write(state.step, {"epoch": epoch + 1, "loss": loss, "test_loss": test_loss,
                                           "accuracy": state.accuracy, "lr": lr, "samples_per_sec": speed,
                                           **comm.summary()})
            if config.checkpoint_dir:
                comm_state = comm.gather_state()        # a collective: every rank takes part
                if rank == 0:
                    checkpoint.save(config.checkpoint_dir, state.step, {"epoch": epoch + 1, "train_loss": loss},
                                    lambda folder: (adapter.save(folder), comm.write(folder, comm_state)),
                                    keep=config.keep_checkpoints)
            state.epoch, state.position, state.epoch_loss = epoch + 1, 0, (0.0, 0)
            if config.elastic:
                state.commit()

    if config.elastic:
        from toolkit import elastic
        state = elastic.run(adapter, train, on_reset=lambda: adapter.on_reset(config), **progress)
        topo = _current(adapter, topo)
    else:
        state = types.SimpleNamespace(**progress)
        train(state)

    if metrics:
        metrics.close()
    world = topo.world_size
    test_x, test_y = data.x_test[topo.rank::topo.size], data.y_test[topo.rank::topo.size]
    accuracy = state.accuracy
    if accuracy is None:    # resumed at the end: nothing left to train, still measure
        _, accuracy = _evaluate(adapter, test_x, test_y)
    digests = check_replicas(adapter)
    trained = [int(n) for n in adapter.allgather_object(state.trained, name="toolkit.steps_trained")]
    start = int(meta.get("step", 0))
    lr = state.lr if state.lr is not None else \
        schedule.lr_at(config, world, state.step, datasets.steps_left(n_train, 0, world, b, k))
    summary = {
        "framework": config.framework, "backend": config.backend.value, "world_size": world,
        "processes": topo.size, "path": comm.describe(adapter.path),
        "steps": state.step, "epochs": config.epochs, "final_loss": state.loss, "accuracy": accuracy,
        # what this process did: resumed at `resumed_from`, ran the steps after it (every rank,
        # trained: the steps each rank computed, fewer on a rank with uneven_data)
        "resumed_from": start if config.resume else None, "steps_run": state.step - start,
        "steps_trained_per_rank": trained,
        "param_digest": digests[0], "final_digests": digests, "initial_digests": initial_digests, "lr": lr,
        "samples_per_sec": state.samples / state.seconds if state.seconds else 0.0,
        "compression": config.compression.value, "sync": config.sync.value, **comm.summary(),
        "device": topo.device, "rank": topo.rank,
    }
    if config.elastic:
        summary["elastic"] = {"world_sizes": state.world_sizes, "resets": state.resets}
    return summary
