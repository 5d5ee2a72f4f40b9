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
