"""The session's checkpoints: what `Session.save` and `Session.load` do, written once for every
framework. The folder format (atomic `ckpt-<step>/` folders, a sha256 of every file in meta.json, the
newest `keep_checkpoints` kept) is toolkit/run/checkpoint.py's; the framework's own files come from the
session's hooks, handed in by the session (adapters/framework.py: gather, write and read its objects).

    save   a collective: buffers averaged, the exchange's residuals, sharded state and every rank's
           random generators (adapters/randomness.py) gathered, then rank 0 writes (a folder it cannot
           write stops every rank with the same line); `checkpoint_async`: rank 0 copies the framework's
           state into memory and writes it in a background thread (toolkit/run/checkpoint.py `Background`)
           while training goes on; the next save, a load and `finish` (the session's close) wait for it, and
           its error stops every rank there; `checkpoint_format: sharded` on torch.distributed: rank 0 makes
           the temporary folder, every rank writes its shards into it (adapters/torch/sharded.py), then rank 0
           adds its files and renames it into place as for every checkpoint
    load   rank 0 verifies and reads the newest checkpoint, the outcome (or the error) broadcast first,
           then the same broadcast as at setup shares it, and each rank takes its random generators
           back; elastic (`collective=False`): rank 0 alone. A sharded checkpoint on torch.distributed: every
           rank reads its own shards instead of the broadcast
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from toolkit import messages
from toolkit.adapters import randomness
from toolkit.config import CheckpointFormat
from toolkit.errors import ToolkitError
from toolkit.run import checkpoint


class Checkpointer:
    def __init__(self, session, gather: Callable[[], None], write: Callable[[Path], None],
                 read: Callable[[Path], None], snapshot: Callable[[], Callable[[Path], None]]):
        self.session = session
        self.gather, self.write, self.read, self.snapshot = gather, write, read, snapshot
        self.background = checkpoint.Background()      # checkpoint_async: rank 0's save in flight

    def save(self, directory: str | None, progress: dict) -> Path | None:
        session = self.session
        directory = directory or session.config.checkpoint_dir
        if not directory:
            raise ToolkitError("session.save(): no folder; pass one or set checkpoint_dir")
        if session.micro:
            raise ToolkitError("session.save() between the micro-batches of one step; save after session.step() "
                               "has stepped")
        session.sync_buffers()
        comm_state = session.communication.gather_state()       # a collective: every rank takes part
        self.gather()                                            # a collective where the state is sharded
        generators = session.allgather_object(session.random_state(), name="toolkit.random")
        meta = {**progress, "loaders": [loader.state_dict() for loader in session.loaders]}
        meta.update(session.on_main(session.tracking_state, name="toolkit.metrics_open") or {})  # rank 0's MLflow run

        step, keep = session.global_step, session.config.keep_checkpoints

        def files(write_objects: Callable[[Path], None]) -> Callable[[Path], None]:
            def write(folder: Path) -> None:
                write_objects(folder)
                session.communication.write(folder, comm_state)
                randomness.write(folder, generators)
            return write

        if session.config.checkpoint_format is CheckpointFormat.SHARDED:
            meta["checkpoint_format"] = CheckpointFormat.SHARDED.value
            if session.shards_on_every_rank:
                return self._save_shards(directory, step, meta, files, keep)
        if not session.config.checkpoint_async:
            return session.on_main(lambda: checkpoint.save(directory, step, meta, files(self.write), keep=keep),
                                   name="toolkit.checkpoint_error")

        def start() -> Path:
            self.background.wait()              # the save before: written, or its error stops every rank here
            write = files(self.snapshot())      # the framework's state in memory now; written by the thread
            self.background.submit(lambda: checkpoint.save(directory, step, meta, write, keep=keep))
            return checkpoint.path_of(directory, step)
        return session.on_main(start, name="toolkit.checkpoint_error")

    def _save_shards(self, directory: str, step: int, meta: dict, files, keep: int) -> Path | None:
        """Rank 0 begins the hidden folder, every rank writes its shards into it, then rank 0 adds its own files
        and renames it into place. `checkpoint_async`: the shards are copied to host memory and written in a
        thread on every rank; rank 0's thread renames the folder once every rank's are written."""
        session, background = self.session, self.session.config.checkpoint_async
        if background:      # the save before written first: `begin` sweeps hidden folders
            self.finish()
        begun = session.on_main(lambda: str(checkpoint.begin(directory, step)), name="toolkit.checkpoint_error")
        begun = Path(session.broadcast_object(begun, name="toolkit.checkpoint_folder") if session.size > 1 else begun)
        written = session.write_shards(begun, background)
        if not background:
            return session.on_main(lambda: checkpoint.save(directory, step, meta, files(self.write), keep=keep,
                                                           begun=begun), name="toolkit.checkpoint_error")

        def start() -> Path:
            write = files(self.snapshot())

            def finish() -> None:
                written()
                checkpoint.save(directory, step, meta, write, keep=keep, begun=begun)
            self.background.submit(finish)
            return checkpoint.path_of(directory, step)
        return session.on_main(start, name="toolkit.checkpoint_error")

    def finish(self) -> None:
        """The save in the background written (a collective where one may be: its error stops every rank)."""
        if self.session.config.checkpoint_async:
            self.session.on_main(self.background.wait, name="toolkit.checkpoint_error")
            self.session.wait_shards()

    def load(self, directory: str | None, collective: bool) -> dict:
        session = self.session
        directory = directory or session.config.checkpoint_dir
        outcome = {}
        session.wait_shards()                   # this rank's shards of a save in the background written
        if session.is_main:
            try:
                self.background.wait()          # a save still being written (checkpoint_async) is the newest
                path, meta = checkpoint.latest(directory)
                try:
                    self.read(path)
                    saved_comm = session.communication.read(path)
                except Exception as e:  # the framework's own reader failed: name the file, not a traceback
                    raise ToolkitError(f"checkpoint {path} cannot be loaded ({e.__class__.__name__}: "
                                       f"{str(e).splitlines()[0] if str(e) else ''}); move it out of the "
                                       f"folder to resume from the one before") from None
                outcome = {"meta": meta, "path": str(path), "communication": saved_comm,
                           "random": randomness.read(path)}
            except ToolkitError as e:
                if not collective:
                    raise
                outcome = {"error": str(e)}
        if collective:
            outcome = session.broadcast_object(outcome, name="toolkit.resume")
            if "error" in outcome:
                raise ToolkitError(outcome["error"])
            if outcome["meta"].get("checkpoint_format") == CheckpointFormat.SHARDED.value and \
                    session.shards_on_every_rank:
                session.read_shards(Path(outcome["path"]))      # every rank its own shards, resharded
            else:
                session.broadcast()
            note = session.communication.load(outcome["communication"])
            if note:
                messages.say(session.rank, f"warning: {note}", session.config.quiet)
            self._restore_random(outcome.get("random"), int(outcome["meta"]["step"]))
        elif not session.is_main:
            return {}
        meta = outcome["meta"]
        for loader, state in zip(session.loaders, meta.get("loaders", [])):
            loader.load_state_dict(state)
        session.global_step = int(meta["step"])
        session.mlflow_run_id = meta.get("mlflow_run_id")
        messages.say(session.rank, f"resumed from {outcome['path']} (step {meta['step']})", session.config.quiet)
        return meta

    def _restore_random(self, saved: dict | None, step: int) -> None:
        """Every rank's generators as they were at the save (the same number of ranks, a framework that
        can set its generator back), else reseeded from (seed, step, rank) and said once."""
        session = self.session
        if saved and saved["ranks"] == session.size and session.random_restorable:
            session.set_random_state(saved["states"][session.rank])
            return
        session._seed(randomness.reseed_value(session.config.seed, step, session.rank))
        why = ("the checkpoint holds none" if not saved else
               f"it was saved by {saved['ranks']} rank{'s' * (saved['ranks'] != 1)}, resumed on {session.size}" if saved["ranks"] != session.size
               else f"{session.name}'s generator cannot be read back")
        messages.say(session.rank, f"random generators: {why}; reseeded from (seed, step, rank)",
                     session.config.quiet)
