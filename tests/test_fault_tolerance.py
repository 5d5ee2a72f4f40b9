"""A job that loses a rank stops, promptly and with an error, and leaves a checkpoint that resumes
(issue 6: fail fast when not elastic). Checkpoint writes killed with SIGKILL: test_checkpoint.py."""
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import TRAIN, digits, horovod_status, kill_rank, one_line_error, started, toolkit, train_job
from toolkit.run import checkpoint

pytestmark = pytest.mark.distributed


@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_killed_rank_stops_the_job_within_60_s_and_the_checkpoint_resumes(tmp_path, controller):
    ckpt = tmp_path / "ckpt"
    argv = ["horovodrun", "-np", "2", "-H", "localhost:2", f"--{controller}", *TRAIN, *digits("torch"),
            "--epochs", "500", "--checkpoint-dir", ckpt, "--quiet"]
    with started(argv) as job:
        deadline = time.monotonic() + 120
        while not checkpoint.all_checkpoints(ckpt):
            assert job.poll() is None and time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.2)
        kill_rank(str(ckpt), rank=1)
        killed = time.monotonic()
        code = job.wait(timeout=90)
        elapsed = time.monotonic() - killed
    assert code != 0, "losing a rank must fail the job"
    assert elapsed < 60, f"the job took {elapsed:.0f} s to stop after a rank died"
    print(f"{controller}: the job stopped {elapsed:.1f} s after rank 1 was killed (exit {code})")
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(ckpt) in " ".join(p.info["cmdline"] or [])], \
        "ranks left running"
    path, meta = checkpoint.latest(ckpt)          # whole and verified
    if controller == "mpi":
        return                                    # resuming does not depend on the controller: once is enough
    out = train_job(controller, digits("torch") + ["--epochs", str(meta["epoch"] + 1), "--resume",
                                                   "--checkpoint-dir", ckpt])
    assert out["steps"] == meta["step"] + 22      # one more epoch of 22 steps on 2 ranks
    assert out["resumed_from"] == meta["step"] and out["steps_run"] == 22   # ... and only that epoch ran


def _files(folder) -> dict:
    """Every file of the checkpoints in `folder` (config.yaml is the run's, rewritten by each)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "config.yaml"}


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs (a disk that fills up), unmounted afterwards; root only (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
def test_a_full_or_read_only_disk_stops_every_rank_with_one_line_and_the_checkpoint_before_intact(small_tmpfs):
    ckpt = small_tmpfs / "ckpt"
    train_job("gloo", digits("torch") + ["--epochs", "1", "--checkpoint-dir", ckpt, "--quiet"])
    path, meta = checkpoint.latest(ckpt)
    before = _files(ckpt)
    with open(small_tmpfs / "filler", "wb") as f:       # the disk is full from here on
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    resume = ["launch", "-np", "2", "--gloo", "--timeout", "150", "--", *TRAIN, *digits("torch"), "--epochs", "2",
              "--resume", "--checkpoint-dir", ckpt, "--quiet"]
    proc = toolkit(*resume, timeout=180)
    line = one_line_error(proc, f"checkpoint_dir {ckpt}: cannot write a checkpoint (No space left on device)",
                          f"{path} is intact", launched=True)
    print(line)
    assert "Traceback" not in proc.stderr and _files(ckpt) == before and checkpoint.latest(ckpt)[0] == path
    (small_tmpfs / "filler").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    proc = toolkit(*resume, timeout=180)
    one_line_error(proc, f"{ckpt}", "Read-only file system", launched=True)
    assert _files(ckpt) == before


@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
@pytest.mark.parametrize("target", ["rank 1", "toolkit launch"])
def test_sigterm_stops_every_rank_after_its_step_rank_0_checkpoints_and_resume_is_exact(tmp_path, target):
    """SIGTERM to one rank of two (a node drained), or to `toolkit launch` (Slurm's, Kubernetes' notice):
    both ranks finish the same step, rank 0 checkpoints mid-epoch, the job exits 75; --resume (after
    the signal to rank 1) ends with the parameters of the run that was never stopped."""
    ckpt = tmp_path / "ckpt"
    args = digits("torch") + ["--epochs", "4", "--quiet"]
    with started([sys.executable, "-m", "toolkit", "launch", "-np", "2", "--gloo", "--timeout", "150", "--",
                  *TRAIN, *args, "--straggler", "0:60", "--checkpoint-dir", ckpt]) as job:
        deadline = time.monotonic() + 120
        while not checkpoint.all_checkpoints(ckpt):      # one epoch done: the signal lands mid-run
            assert job.poll() is None and time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.1)
        if target == "rank 1":
            kill_rank(str(ckpt), signal.SIGTERM, rank=1)
        else:
            psutil.Process(job.pid).send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=90)
    assert job.returncode == 75, err
    path, meta = checkpoint.latest(ckpt)
    stops = re.findall(r"^\[(\d)\]<stderr>:toolkit: stopped: SIGTERM: every rank finished step (\d+); rank 0 wrote "
                       r"(\S+); continue with --resume \(exit 75\)$", err, re.M)
    assert sorted(r for r, _, _ in stops) == ["0", "1"], err
    assert {int(s) for _, s, _ in stops} == {meta["step"]} and {w for _, _, w in stops} == {str(path)}
    assert "toolkit: error" not in err and "Traceback" not in err, err
    assert 22 < meta["step"] < 88, "stopped before the end, after the first epoch"
    assert meta["step"] % 10 == 0, "the ranks check every preemption_check_every (10) steps"
    if target == "rank 1":     # the checkpoint is the same either way: one variant resumes (suite time)
        resumed = train_job("gloo", args + ["--resume", "--checkpoint-dir", ckpt])
        assert resumed["resumed_from"] == meta["step"] and resumed["steps"] == 88
        assert resumed["param_digest"] == train_job("gloo", args)["param_digest"], "resume is not exact"
