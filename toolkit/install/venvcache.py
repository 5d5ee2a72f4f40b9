"""A finished virtualenv kept as hard links, so the next checkout's `toolkit setup` takes seconds, not minutes.

When `setup` has made a new virtualenv (pinned packages, engines, Horovod imported), it links it into
~/.cache/toolkit/venvs/KEY (`cp -al`: every file a hard link, no data copied). KEY names what decided the
install: the pins, this Python, the GPU variant and the engines. A later `setup` of a virtualenv that does
not exist yet, with the same KEY (another clone or worktree, CI's fresh clone), links that copy into place
instead of running pip (a few seconds against about 2 minutes), points the paths a virtualenv holds at its
new place (its scripts' first lines, `activate`, pyvenv.cfg) and installs this checkout's toolkit into it.
uv installs from its cache the same way.

Linked copies share their files, so a file written in place in one would change the others: the toolkit
writes into a virtualenv with `replace_text` (a new file renamed over the old), as pip does. The cache keeps
the newest two copies; a cache on another filesystem (a Docker build's cache mount) keeps none;
TOOLKIT_VENV_CACHE=0 turns it off.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from toolkit.install import cachedir

ENV = "TOOLKIT_VENV_CACHE"
ORIGIN = ".toolkit-origin"      # in a kept copy: the path it was made at
KEEP = 2


def root() -> Path:
    return cachedir.home() / "venvs"


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def key(pins_digest: str, engines, gpu: bool) -> str:
    """What decides the installed files: the pins (their digest), this Python (version and binary), the GPU
    variant, the engines."""
    text = "\n".join([pins_digest, sys.version, os.path.realpath(sys.executable), str(gpu), ",".join(sorted(engines))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def replace_text(path: Path, text: str) -> None:
    """`path` holds `text`, written as a new file renamed over the old one: a linked copy keeps its own."""
    replace_bytes(path, text.encode())


def replace_bytes(path: Path, data: bytes) -> None:
    """`path` holds `data` in a new file (the old one's mode) renamed over it."""
    tmp = path.with_name(path.name + ".toolkit-tmp")
    tmp.write_bytes(data)
    if path.exists():
        shutil.copymode(path, tmp)
    os.replace(tmp, path)


def restore(venv: Path, name: str) -> bool:
    """The kept copy `name` linked in as `venv` (which must not exist), its paths pointed at `venv`;
    False when there is none or it cannot be linked here."""
    kept = root() / name
    if not enabled() or venv.exists() or not (kept / ORIGIN).is_file():
        return False
    partial = venv.with_name(venv.name + ".toolkit-partial")
    shutil.rmtree(partial, ignore_errors=True)
    if subprocess.run(["cp", "-al", str(kept), str(partial)], capture_output=True).returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)      # another filesystem: no hard links across it
        return False
    origin = (partial / ORIGIN).read_text().strip()
    (partial / ORIGIN).unlink()
    repath(partial, origin, str(venv.absolute()))
    os.rename(partial, venv)
    os.utime(kept)                                      # the newest use: kept longest
    return True


def save(venv: Path, name: str) -> bool:
    """`venv` linked into the cache as `name` (replacing an older copy of it); the oldest beyond KEEP removed.
    False when the cache is off or on another filesystem."""
    if not enabled():
        return False
    cache = root()
    cache.mkdir(parents=True, exist_ok=True)
    if os.stat(cache).st_dev != os.stat(venv).st_dev:
        return False
    for stale in cache.glob("*.partial-*"):          # a save that died on the way (another process's is newer)
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
    partial = cache / f"{name}.partial-{os.getpid()}"  # two setups saving at once each write their own
    if subprocess.run(["cp", "-al", str(venv), str(partial)], capture_output=True).returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        return False
    (partial / ORIGIN).write_text(str(venv.absolute()) + "\n")
    shutil.rmtree(cache / name, ignore_errors=True)
    try:
        os.rename(partial, cache / name)
    except OSError:                                  # another setup kept the same one first
        shutil.rmtree(partial, ignore_errors=True)
    kept = sorted((p for p in cache.iterdir() if (p / ORIGIN).is_file()), key=lambda p: p.stat().st_mtime)
    for old in kept[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return True


def repath(venv: Path, old: str, new: str) -> None:
    """Every text file in venv/bin and pyvenv.cfg that names `old` (the virtualenv's earlier path) names `new`,
    each a new file (the kept copy's stays as it was)."""
    for path in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old.encode() not in data or b"\0" in data:
            continue
        replace_bytes(path, data.replace(old.encode(), new.encode()))
