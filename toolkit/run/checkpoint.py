"""Checkpoints as folders `ckpt-<step>/`, written atomically by rank 0, the last N kept.

The adapter writes its framework's files into a temporary folder; this module adds
`meta.json` (progress plus a sha256 of every file), then renames the folder into place, so a
reader sees a whole checkpoint or none. `latest()` checks the hashes before anything is loaded.
`Background` runs one such save at a time in a thread (`checkpoint_async`): the same folder, the same
rename, so a writer killed mid-save leaves the checkpoints before it as they were.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from toolkit.errors import ToolkitError

PREFIX = "ckpt-"
META = "meta.json"
REPLACED, DELETED = "replaced", "old"     # why a checkpoint folder was renamed out of sight
PROBE_BYTES = 1 << 16


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _probe(root: Path) -> OSError | None:
    """Why `root` cannot take a file, if it cannot: a framework's writer reports a full disk in its
    own words (torch: `unexpected pos 1600 vs 1494`), so a small file is written and synced here."""
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e
    return None


def _cannot_write(root: Path, cause: OSError) -> ToolkitError:
    found = all_checkpoints(root) if root.is_dir() else []
    before = f"the previous checkpoint {found[-1]} is intact" if found else "no earlier checkpoint was there"
    why = cause.strerror or cause.__class__.__name__
    return ToolkitError(f"checkpoint_dir {root}: cannot write a checkpoint ({why}); {before}; free space or "
                        f"give a writable folder (--checkpoint-dir), then continue with --resume")


def begin(directory: str | os.PathLike, step: int) -> Path:
    """The hidden temporary folder checkpoint `step` is written into (by `save`; first by every rank where each
    writes its shards). A folder that cannot take it is `save`'s one-line ToolkitError."""
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _recover(root)
        _sweep(root)               # rank 0 begins every save: anything hidden here is a dead writer's
        return Path(tempfile.mkdtemp(prefix=f".{PREFIX}{step:08d}.", dir=root))
    except OSError as e:
        raise _cannot_write(root, e) from None


def save(directory: str | os.PathLike, step: int, progress: dict, write: Callable[[Path], object],
         keep: int, begun: Path | None = None) -> Path:
    """Write checkpoint `step`: `write(tmpdir)` puts the framework's files there (beside what the ranks wrote
    into `begun`, the folder `begin` made, where given). A folder that cannot take it (a full disk, no
    permission, a read-only or missing mount) is a one-line ToolkitError naming the folder and the cause; the
    checkpoints already there are untouched."""
    root = Path(directory)
    tmp = begun if begun is not None else begin(directory, step)
    return _save_in(root, root / f"{PREFIX}{step:08d}", tmp, step, progress, write, keep)


def _save_in(root: Path, final: Path, tmp: Path, step: int, progress: dict, write, keep: int) -> Path:
    try:
        write(tmp)
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        meta = {"step": step, **progress, "files": files}
        (tmp / META).write_text(json.dumps(meta, indent=1))
        for p in tmp.iterdir():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        # The same step again (a resumed run): the old folder is set aside as `replaced`, which
        # `_recover` puts back if this writer dies before the new one is renamed in.
        replaced = _hide(final, REPLACED) if final.exists() else None
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException as e:
        # the cause first, while the partial files still fill the disk; then clean up
        cause = e if isinstance(e, OSError) else _probe(root) if isinstance(e, Exception) else None
        shutil.rmtree(tmp, ignore_errors=True)
        _recover(root)
        if cause is None:          # the folder takes files: the writer's own error, as it is
            raise
        raise _cannot_write(root, cause) from None
    if replaced:
        shutil.rmtree(replaced, ignore_errors=True)
    for old in all_checkpoints(root)[:-keep]:
        shutil.rmtree(_hide(old), ignore_errors=True)
    return final


def _hide(path: Path, why: str = DELETED) -> Path:
    """Rename a checkpoint out of sight before deleting it, so a writer killed mid-delete (kill -9)
    leaves a hidden folder, never a half-deleted `ckpt-*` that `latest()` would pick. A whole
    checkpoint set aside for its replacement is hidden as `replaced` (see `_recover`)."""
    hidden = path.with_name(f".{path.name}.{why}-{os.getpid()}")
    os.rename(path, hidden)
    return hidden


def _recover(root: Path) -> None:
    """A writer killed between setting a checkpoint aside for its replacement and renaming the
    replacement in left the step with no `ckpt-*` folder: put the whole old one back."""
    for p in root.glob(f".{PREFIX}*.{REPLACED}-*"):
        final = root / p.name[1:].split(".", 1)[0]
        if not final.exists():
            os.rename(p, final)


def _sweep(root: Path) -> None:
    """Hidden leftovers of a writer that was killed (temporary or half-deleted folders)."""
    for p in root.glob(f".{PREFIX}*"):
        shutil.rmtree(p, ignore_errors=True)


def all_checkpoints(directory: str | os.PathLike) -> list[Path]:
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def verify(path: Path) -> dict:
    """The checkpoint's meta; a one-line error if a file is missing or its hash differs."""
    try:
        meta = json.loads((path / META).read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ToolkitError(f"checkpoint {path} is unreadable ({META}: {e.__class__.__name__}); "
                           f"move it out of the folder to resume from the one before") from None
    for name, digest in files.items():
        p = path / name
        if not p.is_file() or sha256(p) != digest:
            raise ToolkitError(f"checkpoint {path} is corrupt ({name} does not match its sha256); "
                               f"move it out of the folder to resume from the one before")
    return meta


def refuse_reuse(directory: str | os.PathLike) -> None:
    """A run that does not resume must not write over an earlier run's checkpoints (its own, or a
    parameter server's `server-<i>/` folders): a one-line error naming --resume and a fresh folder."""
    root = Path(directory)
    found = all_checkpoints(root) + [p for d in sorted(root.glob("server-*")) for p in all_checkpoints(d)]
    if found:
        raise ToolkitError(f"checkpoint_dir {directory} already holds an earlier run's checkpoints "
                           f"({found[-1].relative_to(root)}); pass --resume to continue that run, or start "
                           f"fresh in a new folder (e.g. --checkpoint-dir {root.name}-2) or after deleting it")


def latest(directory: str | os.PathLike) -> tuple[Path, dict]:
    if Path(directory).is_dir():
        _recover(Path(directory))
    found = all_checkpoints(directory)
    if not found:
        raise ToolkitError(f"--resume: no checkpoint in {directory}; run once without --resume "
                           f"(with --checkpoint-dir {directory}) first")
    return found[-1], verify(found[-1])


def path_of(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"{PREFIX}{step:08d}"


class Background:
    """One save at a time in a thread, while training goes on. `submit` waits for the save before it; `wait`
    returns when the last one is written and raises its error (a one-line ToolkitError for a folder that cannot
    take it). The thread is not a daemon: a process that exits (or is stopped by SIGTERM's checkpoint) finishes
    writing first; an error no `wait` reported is printed as one line at exit."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def submit(self, save: Callable[[], object]) -> None:
        self.wait()

        def run() -> None:
            try:
                save()
            except BaseException as e:       # kept for wait(), which raises it where training can stop
                self.error = e
        self.thread = threading.Thread(target=run, name="toolkit-checkpoint", daemon=False)
        self.thread.start()
        if not getattr(self, "_reports", False):
            import atexit
            atexit.register(self._report)
            self._reports = True

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _report(self) -> None:
        try:
            self.wait()
        except BaseException as e:
            print(f"toolkit: error: {e}", file=sys.stderr)

