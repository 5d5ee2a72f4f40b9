"""What a user sees and can inspect: progress bar on a terminal only, --quiet, Horovod's timeline."""
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
import threading

import pytest

from tests.conftest import ROOT, TRAIN, clean_env, run, summary
from tests.test_distributed import digits, horovod_status

pytestmark = pytest.mark.distributed
torch_only = pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")


def run_on_terminal(argv, timeout=180) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal (what a user at a shell has); returns (exit, terminal text)."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))   # a terminal has a size
    chunks = []

    def read():
        while True:
            try:
                data = os.read(main, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=side, text=True,
                          timeout=timeout, env=clean_env(), cwd=ROOT)
    os.close(side)
    reader.join(10)
    os.close(main)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


@torch_only
def test_progress_bar_on_a_terminal_only():
    # a model big enough that an epoch outlasts tqdm's 0.1 s refresh interval
    slow = ["--epochs", "1", "--hidden-size", "1024", "--hidden-layers", "3", "--batch-size", "8"]
    code, terminal = run_on_terminal(TRAIN + digits("torch") + slow)
    assert code == 0
    assert re.search(r"epoch 1/1: +\d+%.*\d+/179 .*loss \d\.\d{4}, [\d,]+ samples/s", terminal), terminal[-2000:]
    piped = run(TRAIN + digits("torch") + ["--epochs", "1"], timeout=180)
    assert piped.returncode == 0 and "\r" not in piped.stderr and "samples/s]" not in piped.stderr
    code, quiet = run_on_terminal(TRAIN + digits("torch") + ["--epochs", "1", "--quiet"])
    assert code == 0 and "epoch" not in quiet, quiet[-2000:]


@torch_only
def test_timeline_and_stall_check_reach_horovod(tmp_path):
    timeline = tmp_path / "traces" / "timeline.json"
    proc = run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *TRAIN, *digits("torch"), "--epochs", "1",
                "--timeline-file", timeline, "--stall-check-seconds", "0", "--quiet"], timeout=180)
    out = summary(proc)
    assert out["world_size"] == 2
    text = timeline.read_text()
    assert '"ph"' in text and "ALLREDUCE" in text, text[:500]
    assert not re.search(r"^\[0\]<stderr>:epoch", proc.stderr, re.M), "--quiet: no epoch lines"


@pytest.mark.parametrize("stall, expected", [("0", {"HOROVOD_STALL_CHECK_DISABLE": "1"}),
                                             ("120", {"HOROVOD_STALL_CHECK_TIME_SECONDS": "120"})])
def test_horovod_settings_become_horovod_variables(monkeypatch, tmp_path, stall, expected):
    from adapters.base import apply_horovod_tuning
    from toolkit import config
    env = {}
    monkeypatch.setattr(os, "environ", env)
    apply_horovod_tuning(config.resolve({"timeline_file": str(tmp_path / "t" / "x.json"), "stall_check_seconds": stall,
                                         "fusion_threshold_mb": "2", "cycle_time_ms": "3.5"}, environ={}))
    assert env == {"HOROVOD_TIMELINE": str(tmp_path / "t" / "x.json"), "HOROVOD_FUSION_THRESHOLD": str(2 * 1024 * 1024),
                   "HOROVOD_CYCLE_TIME": "3.5", **expected}
    assert (tmp_path / "t").is_dir(), "Horovod does not create the timeline's folder"


FAKE_WANDB = '''"""A stand-in with the slice of wandb's API the toolkit calls (init -> Run.log / Run.finish); it
records the calls, so the test checks what rank 0 sends without an account or a network."""
import json
import os


def _record(**call):
    with open(os.environ["FAKE_WANDB_LOG"], "a") as f:
        f.write(json.dumps(call) + "\\n")


class Run:
    def log(self, data, step=None):
        _record(call="log", data=data, step=step)

    def finish(self):
        _record(call="finish")


def init(project=None, config=None, dir=None):
    _record(call="init", project=project, config=config, dir=dir)
    return Run()
'''


@torch_only
def test_weights_and_biases_when_installed_and_asked(tmp_path):
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "__init__.py").write_text(FAKE_WANDB)
    calls_file = tmp_path / "calls.jsonl"
    env = clean_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", FAKE_WANDB_LOG=str(calls_file))
    out = summary(run(TRAIN + digits("torch") + ["--epochs", "2", "--wandb-project", "demo", "--quiet"], env=env))
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
    assert [c["call"] for c in calls] == ["init", "log", "log", "finish"]
    assert calls[0]["project"] == "demo" and calls[0]["config"]["epochs"] == 2 and calls[0]["config"]["framework"] == "torch"
    last = calls[2]
    assert last["step"] == out["steps"] and last["data"]["epoch"] == 2
    assert last["data"]["accuracy"] == pytest.approx(out["accuracy"])
    assert {"loss", "test_loss", "lr", "samples_per_sec", "bytes_sent_per_step"} <= set(last["data"])
    # without the key, wandb is never imported: the stand-in would have recorded an init
    calls_file.unlink()
    summary(run(TRAIN + digits("torch") + ["--epochs", "1", "--quiet"], env=env))
    assert not calls_file.exists()


def test_cpu_fusion_default_only_when_nobody_chose(monkeypatch):
    from adapters.base import CPU_FUSION_THRESHOLD_MB, apply_horovod_tuning
    from toolkit import config
    mib = 1024 * 1024
    for environ, fields, expected in [({}, {}, str(CPU_FUSION_THRESHOLD_MB * mib)),     # the CPU default
                                      ({"HOROVOD_FUSION_THRESHOLD": "123"}, {}, "123"),  # horovodrun's flag wins
                                      ({}, {"fusion_threshold_mb": "0"}, "0")]:          # the config wins
        env = dict(environ)
        monkeypatch.setattr(os, "environ", env)
        apply_horovod_tuning(config.resolve(fields, environ={}), default_fusion_mb=CPU_FUSION_THRESHOLD_MB)
        assert env["HOROVOD_FUSION_THRESHOLD"] == expected
    env = {}
    monkeypatch.setattr(os, "environ", env)
    apply_horovod_tuning(config.resolve({}, environ={}))      # GPUs: Horovod's own default
    assert "HOROVOD_FUSION_THRESHOLD" not in env
