"""The training loop, written once for every framework: it drives an adapter (adapters/base.py).

Every rank runs this. Rank 0 alone logs, writes checkpoints, the resolved config and the final
JSON summary; before the summary every rank's parameter digest is gathered and compared.
"""
from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from toolkit import checkpoint, data as datasets, metrics as metrics_log, registry, schedule
from toolkit.communication import Communication
from toolkit.config import Config
from toolkit.errors import ToolkitError


def digest(arrays) -> str:
    """sha256 of the parameters' bytes: equal on two ranks only if every bit is equal."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _log(rank: int, message: str, quiet: bool = False) -> None:
    if rank == 0 and not quiet:
        print(message, file=sys.stderr, flush=True)


def _progress_bar(config: Config, rank: int, epoch: int, steps: int, done: int):
    """Rank 0's tqdm bar for one epoch, only on a terminal and without `quiet` (logs stay clean)."""
    if rank != 0 or config.quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=steps, initial=done, desc=f"epoch {epoch + 1}/{config.epochs}", unit="step",
                leave=False, file=sys.stderr, dynamic_ncols=True)


def _restore(adapter, comm: Communication, config: Config, rank: int) -> dict:
    """Rank 0 verifies and loads the latest checkpoint; every rank learns the outcome, so a bad
    checkpoint stops all ranks with the same message instead of leaving them in a collective.
    Every rank takes its own error-feedback residual from what rank 0 read."""
    outcome = {}
    if rank == 0:
        try:
            path, meta = checkpoint.latest(config.checkpoint_dir)
            try:
                adapter.load(path)
                saved_comm = comm.read(path)
            except Exception as e:  # the framework's own reader failed: name the file, not a traceback
                raise ToolkitError(f"checkpoint {path} cannot be loaded ({e.__class__.__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}); move it out of the "
                                   f"folder to resume from the one before") from None
            outcome = {"meta": meta, "path": str(path), "communication": saved_comm}
        except ToolkitError as e:
            outcome = {"error": str(e)}
    outcome = adapter.broadcast_object(outcome, name="toolkit.resume")
    if "error" in outcome:
        raise ToolkitError(outcome["error"])
    _log(rank, f"resumed from {outcome['path']} (step {outcome['meta']['step']})")
    note = comm.load(outcome["communication"])
    if note:
        _log(rank, f"warning: {note}")
    return outcome["meta"]


def _replica_digests(adapter, name: str) -> list[str]:
    """Every replica's parameter digest, in replica order, on every rank."""
    mine = [digest(p) for p in adapter.replica_parameters()]
    return [d for per_rank in adapter.allgather_object(mine, name=name) for d in per_rank]


def _evaluate(adapter, x, y) -> tuple[float, float]:
    """(mean test loss, accuracy) over every rank's share of the test set."""
    import numpy as np

    loss_sum, correct, count = adapter.allreduce(np.array(adapter.evaluate(x, y), dtype=np.float64),
                                                 average=False)
    return loss_sum / count, correct / count


def run(config: Config) -> dict:
    import numpy as np

    metrics_log.check(config)
    adapter = registry.load(config.framework, config.backend.value, config.keras.value)()
    topo = adapter.init(config)
    rank, size = topo.rank, topo.size
    # Data parallelism counts replicas: one per rank under Horovod, several per process under
    # TensorFlow's mirrored strategies. Replica r of the job gets shard r, as rank r would.
    world, replicas = topo.world_size, range(rank * topo.replicas, (rank + 1) * topo.replicas)
    data = datasets.load(config)
    adapter.build(config, data.num_features, data.num_classes)
    initial_digests = _replica_digests(adapter, "toolkit.initial_digest")
    adapter.wrap(config)
    comm = Communication(config, adapter, rank, world)
    meta = _restore(adapter, comm, config, rank) if config.resume else {}
    adapter.broadcast()

    if rank == 0:
        for folder in filter(None, (config.checkpoint_dir, config.log_dir)):
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "config.yaml").write_text(config.to_yaml())
    n_train = len(data.x_train)
    spe = datasets.steps_per_epoch(n_train, world, config.batch_size, config.accumulation_steps)
    if spe < 1:
        raise ToolkitError(f"batch_size={config.batch_size} x accumulation_steps={config.accumulation_steps} "
                           f"x {world} replicas is more than the {n_train} training samples; lower batch_size")
    step = int(meta.get("step", 0))
    loss = meta.get("train_loss")
    _log(rank, f"{config.framework}/{config.backend.value}: {size} rank(s) x {topo.replicas} replica(s) on "
               f"{topo.device}, {spe} steps/epoch, global batch {config.batch_size * config.accumulation_steps * world}",
         config.quiet)
    samples, train_seconds = 0, 0.0
    test_x, test_y = data.x_test[rank::size], data.y_test[rank::size]
    metrics = metrics_log.MetricsLog(config) if rank == 0 and (config.log_dir or config.wandb_project) else None
    accuracy, lr = None, schedule.lr_at(config, world, step, spe)
    b, k = config.batch_size, config.accumulation_steps
    for epoch in range(step // spe, config.epochs):
        shards = [datasets.epoch_shard(n_train, epoch, config.seed, r, world) for r in replicas]
        t0 = time.perf_counter()
        losses = []
        bar = _progress_bar(config, rank, epoch, spe, step - epoch * spe)
        for s in range(step - epoch * spe, spe):
            adapter.set_lr(lr := schedule.lr_at(config, world, step, spe))
            micro = (np.concatenate([sh[(s * k + j) * b:(s * k + j + 1) * b] for sh in shards]) for j in range(k))
            batches = [(data.x_train[idx], data.y_train[idx]) for idx in micro]
            losses.append(comm.step(batches, step))
            step += 1
            if bar:
                rate = len(losses) * b * k * world / (time.perf_counter() - t0)
                bar.set_postfix_str(f"loss {losses[-1]:.4f}, {rate:,.0f} samples/s", refresh=False)
                bar.update(1)
        if bar:
            bar.close()
        comm.end_epoch()
        train_seconds += time.perf_counter() - t0
        samples += len(losses) * b * k * world
        loss = float(adapter.allreduce(np.array([np.mean(losses)], dtype=np.float64))[0])
        test_loss, accuracy = _evaluate(adapter, test_x, test_y)
        speed = samples / train_seconds if train_seconds else 0.0
        _log(rank, f"epoch {epoch + 1}/{config.epochs}  loss {loss:.4f}  test_loss {test_loss:.4f}  "
                   f"accuracy {accuracy:.4f}  lr {lr:.4g}  {speed:,.0f} samples/s", config.quiet)
        if metrics:
            metrics.write(step, {"epoch": epoch + 1, "loss": loss, "test_loss": test_loss, "accuracy": accuracy,
                                 "lr": lr, "samples_per_sec": speed, **comm.summary()})
        if config.checkpoint_dir:
            comm_state = comm.gather_state()        # a collective: every rank takes part
            if rank == 0:
                checkpoint.save(config.checkpoint_dir, step, {"epoch": epoch + 1, "train_loss": loss},
                                lambda folder: (adapter.save(folder), comm.write(folder, comm_state)),
                                keep=config.keep_checkpoints)

    if metrics:
        metrics.close()
    if accuracy is None:    # resumed at the end: nothing left to train, still measure
        _, accuracy = _evaluate(adapter, test_x, test_y)
    digests = _replica_digests(adapter, "toolkit.final_digest")
    if len(set(digests)) != 1:
        raise ToolkitError("replica check failed: replicas ended with different parameters "
                           f"(digests by replica: {digests}); this is a bug, please report it", code=1)
    final_digest = digests[0]
    return {
        "framework": config.framework, "backend": config.backend.value, "world_size": world,
        "processes": size, "path": comm.describe(adapter.path),
        "steps": step, "epochs": config.epochs, "final_loss": loss, "accuracy": accuracy,
        "param_digest": final_digest, "initial_digests": initial_digests, "lr": lr,
        "samples_per_sec": samples / train_seconds if train_seconds else 0.0,
        "compression": config.compression.value, "sync": config.sync.value, **comm.summary(),
        "device": topo.device, "rank": rank,
    }
