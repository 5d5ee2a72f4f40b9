"""The built-in training loop (`toolkit train`, examples/train.py): the first user of the public API.

Every rank runs this, through the session's verbs only (adapters/base.py): start, setup of the
built-in or the user's model, loaders, train_step, evaluate, save/load, check_replicas. Rank 0
alone logs, writes checkpoints, the resolved config and the final JSON summary; before the summary
every replica's parameter digest is gathered and compared.
"""
from __future__ import annotations

import time
import types
from typing import Any

from toolkit import messages
from toolkit.config import PS_SYNCS, Config
from toolkit.data import datasets
from toolkit.errors import ToolkitError
from toolkit.messages import say
from toolkit.run import metrics as metrics_log
from toolkit.run import pipeline, preemption, throughput

BAR_LOSS_EVERY = 10     # steps between the progress bar's readings of the loss


def _progress_bar(config: Config, rank: int, epoch: int, steps: int, done: int):
    """Rank 0's tqdm bar for one epoch, only on a terminal and without `quiet` (logs stay clean)."""
    if rank != 0 or config.quiet:
        return None
    return messages.bar(steps, f"epoch {epoch + 1}/{config.epochs}", "step", initial=done)


def _preempted(config: Config, session, state, epoch: int) -> None:
    """SIGTERM reached a rank: every rank has finished this step (the first check, every
    preemption_check_every steps, after the signal); rank 0 checkpoints mid-epoch (the
    loaders' positions are in it, so --resume continues at the next batch); every rank exits 75."""
    if config.checkpoint_dir:
        session.save(epoch=epoch, train_loss=None)
    raise preemption.Preempted(state.step, config.checkpoint_dir)


def run(config: Config) -> dict:
    metrics_log.check(config)
    if config.sync in PS_SYNCS:         # a parameter server job: its own loop (toolkit/run/ps.py)
        from toolkit.run import ps
        return ps.run(config)
    session = pipeline.start(config)
    data = datasets.datasets(config, session)
    initial_digests, train_loader, eval_loader = pipeline.prepare(config, session, data)
    meta = pipeline.resume(session, config)
    session.on_main(session.open_log, name="toolkit.metrics_open")   # an MLflow server out of reach: one line
    delays, fractions = config.straggler_delays(), config.data_fractions()
    measured: dict[str, Any] = {}       # FLOPs and tokens of one sample, from the first step's batch
    peak = throughput.peak(config.peak_tflops, session.device_name())
    # What a failure rolls back to and a new worker receives (elastic), or just the loop's counters.
    epoch = int(meta.get("epoch", 0))      # a checkpoint of the loader mid-epoch resumes there (user loops)
    position = train_loader.sampler.position if train_loader.sampler.epoch == epoch else 0
    # the loader's whole position (a sharded stream's segments too), kept beside the count of samples
    loader_state = train_loader.state_dict() if train_loader.sampler.epoch == epoch else None
    progress: dict[str, Any] = dict(epoch=epoch, position=position, loader=loader_state,
                    step=int(meta.get("step", 0)), loss=meta.get("train_loss"), accuracy=None, lr=None, samples=0,
                    seconds=0.0, world_sizes=[], resets=0, trained=0)

    def train(state) -> None:
        if config.elastic:   # the world may have changed since the last call
            session.refresh_topology()
        rank, size, replicas_per_rank = session.rank, session.size, session.replicas
        world = session.world_size
        train_loader.sampler.resize(world, session.my_replicas())
        eval_loader.sampler.resize(world, session.my_replicas())
        spe = train_loader.steps_per_epoch
        if spe is None:
            raise ToolkitError(f"dataset={config.dataset!r}: the built-in trainer needs data whose length it knows (a "
                               "stream has none); give a dataset with a length, or write the data with `toolkit shards` "
                               "and use dataset shards:PATH")
        b, k = config.batch_size, config.accumulation_steps
        if spe < 1:
            raise ToolkitError(f"batch_size={b} x accumulation_steps={k} x {world} replicas is more than the "
                               f"{train_loader.sampler.n} training samples; lower batch_size")
        if config.elastic and state.world_sizes:    # called again: Horovod re-formed the job
            state.resets += 1
        if state.world_sizes[-1:] != [world]:
            state.world_sizes = state.world_sizes + [world]
            say(rank, f"{config.framework}/{config.backend.value}: {size} rank(s) x {replicas_per_rank} "
                       f"replica(s) on {session.device}, {spe} steps/epoch, global batch {b * k * world}", config.quiet)
        delay = delays.get(rank, 0.0)
        my_steps = int(spe * fractions.get(rank, 1.0))      # uneven_data: this rank's batches per epoch
        compiling = config.compile
        while state.epoch < config.epochs:
            epoch = state.epoch
            train_loader.load_state_dict(state.loader if state.loader and state.loader["epoch"] == epoch
                                         else {"epoch": epoch, "position": state.position})
            t0, done, epoch_loss, shown = time.perf_counter(), 0, None, None
            done_before = state.position // train_loader.sampler.step_samples
            bar = _progress_bar(config, rank, epoch, spe, done_before)
            for batches in train_loader.steps():
                if not measured:        # once a job, on every rank: the FLOPs and tokens of one sample
                    measured.update(zip(("flops", "tokens"), session.throughput_basis(batches[0])))
                if done_before + done >= my_steps:      # out of data: the others go on (it joins)
                    state.step, state.position = state.step + 1, train_loader.sampler.position
                    state.loader = train_loader.state_dict()
                    continue
                session.set_lr(lr := session.lr(state.step, spe))
                if delay:
                    time.sleep(delay)
                t_step = time.perf_counter()
                loss = session.train_step(batches)
                if compiling:       # the first step compiles: its time and what compiling did, said once
                    compiling = False
                    session.to_float(loss)
                    say(rank, f"compile: the first step took {time.perf_counter() - t_step:.1f} s; "
                              f"{session.compile_report()}", config.quiet)
                epoch_loss = loss if epoch_loss is None else epoch_loss + loss
                state.trained += 1      # optimizer steps this rank computed in this process
                state.step, state.position, state.lr, done = state.step + 1, train_loader.sampler.position, lr, done + 1
                state.loader = train_loader.state_dict()
                if bar:     # the loss read back every BAR_LOSS_EVERY steps only (a host sync on a GPU)
                    if done % BAR_LOSS_EVERY == 1 or shown is None:
                        shown = session.to_float(loss)
                    rate = done * b * k * world / (time.perf_counter() - t0)
                    bar.set_postfix_str(f"loss {shown:.4f}, {rate:,.0f} samples/s", refresh=False)
                    bar.update(1)
                if config.elastic and state.step % config.elastic_commit_every == 0:
                    state.commit()
                elif not config.elastic and not fractions and state.step % config.preemption_check_every == 0 \
                        and session.should_stop():
                    if bar:
                        bar.close()
                    _preempted(config, session, state, epoch)
            if bar:
                bar.close()
            if fractions:   # ranks that ran out joined: the last one has every step; its model for all
                session.broadcast(root=session.join())
            session.communication.end_epoch()
            state.seconds += time.perf_counter() - t0
            state.samples += done * b * k * world
            # the epoch's mean loss: one host read per epoch, not per step
            mean = session.to_float(epoch_loss) / done if done else float("nan")
            state.loss = loss = session.mean(mean, name="toolkit.epoch_loss")
            test_loss, state.accuracy = session.evaluate(eval_loader)
            speed = state.samples / state.seconds if state.seconds else 0.0
            rates = throughput.figures(speed, world, measured.get("flops"), measured.get("tokens"), peak)
            lr = state.lr if state.lr is not None else session.lr(state.step, spe)
            on = f"  on {world}" if config.elastic else ""
            accuracy = f"{state.accuracy:.4f}" if state.accuracy is not None else "-"
            mfu = f"  mfu {rates['mfu']:.1%}" if "mfu" in rates else ""
            say(rank, f"epoch {epoch + 1}/{config.epochs}  loss {loss:.4f}  test_loss {test_loss:.4f}  "
                       f"accuracy {accuracy}  lr {lr:.4g}  {speed:,.0f} samples/s{mfu}{on}", config.quiet)
            session.log(state.step, {"epoch": epoch + 1, "loss": loss, "test_loss": test_loss,
                                     "accuracy": state.accuracy, "lr": lr, "samples_per_sec": speed, **rates,
                                     "train_seconds": state.seconds, **session.communication.summary()})
            state.epoch, state.position, state.loader = epoch + 1, 0, None
            if config.checkpoint_dir:
                session.save(epoch=epoch + 1, train_loss=loss)
            if config.elastic:
                state.commit()

    if config.elastic:
        from toolkit.run import elastic
        state = elastic.run(session, train, **progress)
        session.refresh_topology()
    else:
        state = types.SimpleNamespace(**progress)
        train(state)

    accuracy = state.accuracy
    if accuracy is None and not state.trained:
        _, accuracy = session.evaluate(eval_loader)    # resumed at the end: nothing left to train, still measure
    digests = session.check_replicas()
    trained = [int(n) for n in session.allgather_object(state.trained, name="toolkit.steps_trained")]
    speed = state.samples / state.seconds if state.seconds else 0.0
    start_step = int(meta.get("step", 0))
    lr = state.lr if state.lr is not None else session.lr(state.step, train_loader.steps_per_epoch)
    summary = pipeline.summary(
        config, session, world_size=session.world_size, processes=session.size,
        path=session.communication.describe(session.path), steps=state.step, final_loss=state.loss,
        accuracy=accuracy, start_step=start_step, steps_trained=trained, digests=digests,
        initial_digests=initial_digests, lr=lr, samples_per_sec=speed,
        details={**throughput.figures(speed, session.world_size, measured.get("flops"), measured.get("tokens"), peak),
                 **session.communication.summary(), "precision": config.precision.value,
                 "skipped_steps": session.skipped_steps})
    if config.elastic:
        summary["elastic"] = {"world_sizes": state.world_sizes, "resets": state.resets}
    # the last async checkpoint written; MLflow's run keeps the summary as printed (the rank is the printer's)
    session.close({k: v for k, v in summary.items() if k != "rank"})
    return summary
