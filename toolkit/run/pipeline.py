"""The one pipeline every caller runs on each rank, in this order:

    resolve -> quiet logs -> start -> setup -> loaders -> resume -> (train) -> summary -> exit code

- a user's script: `toolkit.start(...)` runs resolve, quiet logs and start, and goes on by itself;
- `toolkit train` / examples/train.py: all of it, training by toolkit/run/trainer.py
  (toolkit/commands/train.py prints its summary);
- the parameter server's workers (toolkit/run/ps.py): start on their communicator, setup, loaders, their
  own loop, the same summary;
- `toolkit bench` (toolkit/planner/bench.py): start, setup, one batch, timed steps.

Every stage is written once here or in toolkit/api.py (what a model and loaders are made of), and
the JSON summary's common part is built here once.
"""
from __future__ import annotations

from pathlib import Path

from toolkit import api
from toolkit.errors import ToolkitError
from toolkit.run import checkpoint, quiet
from toolkit.startup import collector_paused


def start(config, comm=None):
    """Quiet logs (before any framework is imported), then the framework's session on its strategy:
    init, one device per local rank, threads, seeds; the imports without Python's collector (toolkit/startup.py)."""
    quiet.quiet_framework_logs(config)
    with collector_paused():
        return api.start(config, comm)


def prepare(config, session, data):
    """setup (the user's or the built-in model, broadcast) -> every replica's initial digest -> loaders.
    Returns (initial digests, train loader, eval loader). Elastic: the digests are this rank's own,
    no collective before hvd.elastic.run (a worker that joins later meets the others in its sync)."""
    with collector_paused():
        api.setup(config, session, data)
    if config.elastic:
        initial = list(session.local_digests)
    else:
        initial = [d for per in session.allgather_object(session.local_digests, name="toolkit.initial_digest")
                   for d in per]
    train_loader, eval_loader = api.loaders(config, session, data)
    return initial, train_loader, eval_loader


def resume(session, config) -> dict:
    """With `resume`: the newest checkpoint, loaded by the session (its model, optimizer, loaders,
    exchange state). Without: checkpoint_dir must not hold an earlier run (nothing is overwritten);
    rank 0 looks and every rank learns the outcome (elastic: rank 0 alone, no collective before
    hvd.elastic.run). Then rank 0 writes the resolved config beside the checkpoints."""
    meta = _resume(session, config)
    session.on_main(lambda: write_config(config), name="toolkit.config_written")   # one line on every rank
    return meta


def _resume(session, config) -> dict:
    if not config.checkpoint_dir:
        return {}
    if config.resume:
        return session.load(collective=not config.elastic)
    if session.strategy.restarted():    # torchrun started the ranks again: on from the newest checkpoint, if any
        found = session.broadcast_object(bool(checkpoint.all_checkpoints(config.checkpoint_dir))
                                         if session.is_main else None, name="toolkit.restart_found")
        return session.load() if found else {}
    problem = None
    if session.is_main:
        try:
            checkpoint.refuse_reuse(config.checkpoint_dir)
        except ToolkitError as e:
            if config.elastic:
                raise
            problem = str(e)
    if not config.elastic:
        problem = session.broadcast_object(problem, name="toolkit.fresh")
    if problem:
        raise ToolkitError(problem)
    return {}


def write_config(config) -> None:
    """config.yaml beside the checkpoints and the logs, so a run can be reproduced."""
    for folder in filter(None, (config.checkpoint_dir, config.log_dir)):
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "config.yaml").write_text(config.to_yaml())
        except OSError as e:
            raise ToolkitError(f"{folder}: cannot write config.yaml ({e.strerror or e}); free space or give a "
                               f"writable folder (--checkpoint-dir / log_dir)") from None


def summary(config, session, *, world_size: int, processes: int, path: str, steps: int, final_loss, accuracy,
            start_step: int, steps_trained: list, digests: list, initial_digests: list, lr: float,
            samples_per_sec: float, details: dict) -> dict:
    """The JSON summary: what this job did, not only where it ended; `details` are the caller's own
    figures (the exchange's bytes, the servers' staleness), between the common ones and the rank's."""
    return {
        "framework": config.framework, "backend": config.backend.value, "world_size": world_size,
        "processes": processes, "path": path, "steps": steps, "epochs": config.epochs,
        "final_loss": final_loss, "accuracy": accuracy,
        # what this process did: resumed at `resumed_from`, ran the steps after it (every rank,
        # trained: the steps each rank computed, fewer on a rank with uneven_data)
        "resumed_from": start_step if config.resume or start_step else None, "steps_run": steps - start_step,
        "steps_trained_per_rank": steps_trained,
        "param_digest": digests[0], "final_digests": digests, "initial_digests": initial_digests, "lr": lr,
        # compression: the one that ran (auto's choice, which compression_auto explains)
        "samples_per_sec": samples_per_sec, "compression": session.config.compression.value, "sync": config.sync.value,
        **({"compression_auto": session.compression_choice.summary()} if session.compression_choice else {}),
        **details, "device": session.device, "rank": session.rank,
    }
