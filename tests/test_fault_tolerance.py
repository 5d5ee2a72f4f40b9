"""A job that loses a rank stops, promptly and with an error, and leaves a checkpoint that resumes
(issue 6: fail fast when not elastic). Checkpoint writes killed with SIGKILL: test_checkpoint.py."""
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.conftest import ROOT, TRAIN, clean_env, train_job
from tests.test_distributed import digits, horovod_status
from toolkit import checkpoint

pytestmark = pytest.mark.distributed


def rank_process(marker: str, rank: int) -> psutil.Process:
    """The training process of `rank` in the job whose command line contains `marker`."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and "examples/train.py" in " ".join(p.info["cmdline"]) \
                    and str(rank) in (p.environ().get("HOROVOD_RANK"), p.environ().get("OMPI_COMM_WORLD_RANK")):
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no rank {rank} process for {marker}")


@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_killed_rank_stops_the_job_within_60_s_and_the_checkpoint_resumes(tmp_path, controller):
    ckpt = tmp_path / "ckpt"
    argv = ["horovodrun", "-np", "2", "-H", "localhost:2", f"--{controller}", *TRAIN, *digits("torch"),
            "--epochs", "500", "--checkpoint-dir", ckpt, "--quiet"]
    job = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=clean_env(), cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.all_checkpoints(ckpt):
            assert job.poll() is None and time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.2)
        rank_process(str(ckpt), 1).send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = job.wait(timeout=90)
        elapsed = time.monotonic() - killed
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
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
