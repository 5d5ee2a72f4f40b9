"""Checkpoints as folders `ckpt-<step>/`, written atomically by rank 0, the last N kept.

The adapter writes its framework's files into a temporary folder; this module adds
`meta.json` (progress plus a sha256 of every file), then renames the folder into place, so a
reader sees a whole checkpoint or none. `latest()` checks the hashes before anything is loaded.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from toolkit.errors import ToolkitError

PREFIX = "ckpt-"
META = "meta.json"
REPLACED, DELETED = "replaced", "old"     # why a checkpoint folder was renamed out of sight


def _sha256(path: Path) -> str:
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


def save(directory: str | os.PathLike, step: int, progress: dict, write: Callable[[Path], None],
         keep: int) -> Path:
    """Write checkpoint `step`: `write(tmpdir)` puts the framework's files there."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    _recover(root)
    _sweep(root)                   # rank 0 is the only writer: anything hidden here is a dead writer's
    final = root / f"{PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        write(tmp)
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _recover(root)
        raise
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
        if not p.is_file() or _sha256(p) != digest:
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
