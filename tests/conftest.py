"""Shared helpers: run the CLI and real multi-rank jobs as subprocesses, always with a timeout."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAIN = [sys.executable, str(ROOT / "examples" / "train.py")]
BIN = Path(sys.executable).parent


# Set by libraries on their first import (scikit-learn, MXNet's OpenMP), not by the code under test.
IMPORT_SIDE_EFFECTS = {"PYTEST_CURRENT_TEST", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK",
                       "CRC32C_SW_MODE",    # tensorboardX (crc32c) on import
                       "TORCHINDUCTOR_CACHE_DIR"}   # torch.optim on first import


@pytest.fixture(autouse=True)
def restore_env_variables():
    """Fail a test that leaks environment variables (Lightning's fixture)."""
    before = dict(os.environ)
    yield
    leaked = {k for k in os.environ if k not in before} | {k for k in before if os.environ.get(k) != before[k]}
    leaked -= IMPORT_SIDE_EFFECTS
    os.environ.clear()
    os.environ.update(before)
    assert not leaked, f"test leaked environment variables: {sorted(leaked)}"


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLKIT_", "HOROVOD_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(argv, timeout=300, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(), cwd=cwd or ROOT)


def toolkit(*args, **kw) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "toolkit", *args], **kw)


def summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-4000:]}"
    # horovodrun tags each line with the rank: "[0]<stdout>:" (gloo) or "[1,0]<stdout>:" (MPI)
    lines = [ln for ln in re.sub(r"\[[\d,]+\]<stdout>:", "", proc.stdout).splitlines() if ln.startswith("{")]
    assert len(lines) == 1, f"expected one JSON line on stdout, got {proc.stdout!r}"
    return json.loads(lines[0])


def train_job(launcher: str, args, np_: int = 2, timeout: int = 300, env=None, direct: bool = False) -> dict:
    """One real training job: 'single', 'gloo' / 'mpi' (horovodrun), or 'mpirun'. Launched through
    `toolkit launch` (its horovodrun starts ~3 s sooner), or with `direct` the plain horovodrun command."""
    if launcher == "single":
        argv = TRAIN + list(args)
    elif launcher == "mpirun":
        argv = [sys.executable, "-m", "toolkit", "launch", "-np", np_, "--launcher", "mpirun",
                "--timeout", timeout - 10, "--", *TRAIN, *args]
    elif not direct:
        argv = [sys.executable, "-m", "toolkit", "launch", "-np", np_, f"--{launcher}", "--start-timeout", "60",
                "--timeout", timeout - 10, "--", *TRAIN, *args]
    else:
        argv = ["horovodrun", "-np", np_, "-H", f"localhost:{np_}", f"--{launcher}",
                "--start-timeout", "60", *TRAIN, *args]
    return summary(run(argv, timeout=timeout, env=env))


def one_line_error(proc: subprocess.CompletedProcess, *needles: str, launched: bool = False) -> str:
    """The CLI's contract for bad input: non-zero exit, one `toolkit: error:` line, no traceback.

    With `launched`, the output is horovodrun's: each rank's lines are tagged `[rank]<stderr>:`, and
    horovodrun itself prints a traceback when a rank fails, so only the ranks' lines are checked.
    """
    assert proc.returncode != 0, f"expected failure, got exit 0: {proc.stdout}"
    ours = re.findall(r"^\[[\d,]+\]<stderr>:(.*)$", proc.stderr, re.M) if launched else proc.stderr.splitlines()
    assert ours and not any("Traceback" in ln for ln in ours), proc.stderr
    errors = [ln for ln in ours if "toolkit: error:" in ln]
    assert errors, f"no `toolkit: error:` line in stderr:\n{proc.stderr}"
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]
