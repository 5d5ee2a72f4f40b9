"""Atomic checkpoints: keep-N, verification, and a clear error for a corrupt one."""
import pytest

from toolkit import checkpoint
from toolkit.errors import ToolkitError


def writer(payload: bytes):
    def write(folder):
        (folder / "state.bin").write_bytes(payload)
    return write


def test_save_keeps_last_n_and_latest_is_newest(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path, step, {"epoch": step // 10}, writer(bytes([step])), keep=2)
    names = [p.name for p in checkpoint.all_checkpoints(tmp_path)]
    assert names == ["ckpt-00000030", "ckpt-00000040"]
    path, meta = checkpoint.latest(tmp_path)
    assert path.name == "ckpt-00000040" and meta["step"] == 40 and meta["epoch"] == 4
    assert (path / "state.bin").read_bytes() == bytes([40])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary folders left behind"


def test_failed_write_leaves_nothing(tmp_path):
    checkpoint.save(tmp_path, 1, {}, writer(b"ok"), keep=3)

    def boom(folder):
        (folder / "state.bin").write_bytes(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        checkpoint.save(tmp_path, 2, {}, boom, keep=3)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-00000001"]


def test_corrupt_latest_is_a_clear_error_and_older_untouched(tmp_path):
    checkpoint.save(tmp_path, 1, {}, writer(b"first"), keep=3)
    checkpoint.save(tmp_path, 2, {}, writer(b"second"), keep=3)
    (tmp_path / "ckpt-00000002" / "state.bin").write_bytes(b"garbage")
    with pytest.raises(ToolkitError, match="ckpt-00000002 is corrupt.*move it out"):
        checkpoint.latest(tmp_path)
    assert (tmp_path / "ckpt-00000001" / "state.bin").read_bytes() == b"first"
    checkpoint.verify(tmp_path / "ckpt-00000001")


def test_no_checkpoint(tmp_path):
    with pytest.raises(ToolkitError, match="no checkpoint in"):
        checkpoint.latest(tmp_path / "empty")


WRITER = """
import os, sys
from toolkit import checkpoint
i = 0
while True:   # each step saved twice (a resumed run re-saves its step) and 2 kept: every path of save()
    checkpoint.save(sys.argv[1], i // 2, {"i": i}, lambda d: (d / "w.bin").write_bytes(os.urandom(1 << 21)), keep=2)
    print(i, flush=True)
    i += 1
"""


def test_kill_9_during_writes_never_leaves_a_corrupt_latest(tmp_path):
    """20 writers killed with SIGKILL at random moments: the newest checkpoint always verifies, and
    the next save clears what the dead writer left."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT, clean_env
    rng = random.Random(0)
    folder = tmp_path / "ckpt"
    for trial in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], cwd=ROOT, env=clean_env(),
                                stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()                  # at least one checkpoint exists
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        path, meta = checkpoint.latest(folder)   # raises if the newest is corrupt or half-written
        assert path.name == f"ckpt-{meta['step']:08d}"
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    checkpoint.save(folder, 10_000, {}, lambda d: (d / "w.bin").write_bytes(b"x"), keep=2)
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], f"left behind: {leftovers}"
