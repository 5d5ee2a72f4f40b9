"""What a user sees and can inspect: progress bar on a terminal only, --quiet, Horovod's timeline."""
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT, TRAIN, clean_env, digits, horovod_status, run, summary

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
    piped = run(TRAIN + digits("torch") + slow, timeout=180)       # as slow: a bar would have rendered
    assert piped.returncode == 0 and "\r" not in piped.stderr and "samples/s" not in piped.stderr.split("epoch 1/1  ")[0]
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
    from toolkit import config
    from toolkit.adapters.horovod import apply_horovod_tuning
    env = {}
    monkeypatch.setattr(os, "environ", env)
    apply_horovod_tuning(config.resolve({"timeline_file": str(tmp_path / "t" / "x.json"), "stall_check_seconds": stall,
                                         "fusion_threshold_mb": "2", "cycle_time_ms": "3.5"}, environ={}))
    assert env == {"HOROVOD_TIMELINE": str(tmp_path / "t" / "x.json"), "HOROVOD_FUSION_THRESHOLD": str(2 * 1024 * 1024),
                   "HOROVOD_CYCLE_TIME": "3.5", **expected}
    assert (tmp_path / "t").is_dir(), "Horovod does not create the timeline's folder"


def wandb_records(log_dir) -> list:
    """The records of the one offline W&B run under `log_dir`, read back from its transaction log
    (`run-<id>.wandb`: LevelDB's log framing, 32 KiB blocks, 7-byte chunk headers, protobuf
    `Record`s; wandb 0.31 ships the protobuf classes but no reader)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(log_dir).glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:                   # the rest of a block is padding
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):              # FULL, or LAST of FIRST/MIDDLE/LAST
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


@torch_only
def test_weights_and_biases_when_asked(tmp_path):
    """The real W&B client (pinned by `make setup`), offline: what the toolkit logged is read back
    from the run's own files."""
    env = clean_env(WANDB_MODE="offline", WANDB_SILENT="true")
    out = summary(run(TRAIN + digits("torch") + ["--epochs", "2", "--wandb-project", "demo", "--log-dir", tmp_path,
                                                 "--quiet"], env=env))
    records = wandb_records(tmp_path)
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in start.config.update}
    assert start.project == "demo" and config["epochs"] == 2 and config["framework"] == "torch"
    logged = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item} for h in logged]
    assert [h.step.num for h in logged] == [out["steps"] // 2, out["steps"]]
    assert [h["epoch"] for h in history] == [1, 2]
    assert history[-1]["accuracy"] == pytest.approx(out["accuracy"])
    assert {"loss", "test_loss", "lr", "samples_per_sec"} <= set(history[-1])
    assert any(r.WhichOneof("record_type") == "exit" for r in records), "the run was not finished"
    # without the key, wandb is never imported (no second run appears)
    summary(run(TRAIN + digits("torch") + ["--epochs", "1", "--log-dir", tmp_path, "--quiet"], env=env))
    assert len(list(tmp_path.glob("wandb/offline-run-*"))) == 1


def test_cpu_fusion_default_only_when_nobody_chose(monkeypatch):
    from toolkit import config
    from toolkit.adapters.horovod import CPU_FUSION_THRESHOLD_MB, apply_horovod_tuning
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


def test_toolkit_shards_shows_a_bar_of_samples_on_a_terminal_only(tmp_path):
    """`toolkit shards` writing a text file's samples: tqdm's bar (samples written, samples/s) on a terminal; piped,
    no bar, the one summary line."""
    from tests.workload_data import text_file
    corpus = text_file(tmp_path / "corpus.txt")
    argv = [sys.executable, "-m", "toolkit", "shards", f"text:{corpus}", tmp_path / "tty", "--framework", "torch",
            "--context", "16", "--shard-size", "50"]
    code, terminal = run_on_terminal(argv)
    assert code == 0 and re.search(r"toolkit shards: +\d+%.*\| *\d+/\d+ \[.*sample/s\]", terminal), terminal[-2000:]
    piped = run([*argv[:5], tmp_path / "piped", *argv[6:]], timeout=120)
    assert piped.returncode == 0 and "\r" not in piped.stderr and "sample/s" not in piped.stderr, piped.stderr
    assert piped.stdout.startswith("toolkit shards: ") and len(piped.stdout.splitlines()) == 1, piped.stdout


def assert_profiled(folder: Path, steps: int | None) -> None:
    """Both ranks' Chrome traces in `folder` (with `steps`: exactly that many optimizer steps in each, torch's
    `Optimizer.step#...` ranges), and `toolkit profile merge` joining them, one named process row per rank."""
    from toolkit.run import profile
    found = profile.traces(folder)
    assert sorted(found) == [0, 1], sorted(folder.iterdir())
    for path in found.values():
        events = json.loads(path.read_text())["traceEvents"]
        assert len(events) > 10, path
        if steps is not None:
            ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                            if e.get("name", "").startswith("Optimizer.step#") and e.get("ph") == "X")
            outer, end = 0, float("-inf")       # Horovod's step runs torch's inside it: count the outer ranges
            for start, stop in ranges:
                if start >= end:
                    outer, end = outer + 1, stop
            assert outer == steps, ranges
    proc = run([sys.executable, "-m", "toolkit", "profile", "merge", folder], timeout=60)
    assert proc.returncode == 0 and "2 ranks' traces merged" in proc.stdout, proc.stdout + proc.stderr
    merged = json.loads((folder / profile.MERGED).read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in merged if e.get("name") == "process_name"}
    assert {n.split(" (")[0] for n in names.values()} == {"rank 0", "rank 1"}, names
    assert {e["pid"] for e in merged} == set(names), "every event in a process row of its rank"


def test_flops_per_sample_and_mfu_of_a_known_model(tmp_path):
    """torch's FLOP counter over the built-in MLP (64 -> 32 -> 32 -> 10 on digits) gives exactly the matmuls'
    count, three forward passes a training sample; with `peak_tflops` the summary and every metrics line get
    mfu = FLOPs a sample x samples/s / devices / peak; nothing the training computes changes (tests/
    test_distributed's digests, benchmarks/digest_matrix.py). The same job profiles steps 3 to 6 on each rank
    (torch.profiler), and the two traces merge into one timeline."""
    from tests.conftest import train_job
    out = train_job("gloo", [*digits("torch"), "--hidden-size", "32", "--hidden-layers", "2", "--epochs", "1",
                             "--peak-tflops", "0.002", "--log-dir", tmp_path, "--quiet",
                             "--profile-dir", tmp_path / "prof", "--profile-steps", "3:7"])
    assert_profiled(tmp_path / "prof", steps=4)
    forward = 2 * (64 * 32 + 32 * 32 + 32 * 10)
    assert out["flops_per_sample"] == 3 * forward, out
    assert out["mfu"] == pytest.approx(3 * forward * out["samples_per_sec"] / 2 / 2e9, rel=1e-12), out
    assert "tokens_per_sec" not in out
    (epoch,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert epoch["flops_per_sample"] == 3 * forward and epoch["mfu"] > 0, epoch


@pytest.mark.parametrize("framework", ["tensorflow", "mxnet"])
def test_each_rank_writes_its_profile_of_the_steps_asked(framework, tmp_path):
    """profile_dir on 2 ranks: MXNet's profiler writes each rank's Chrome trace (merged as torch's are);
    TensorFlow's writes each rank's XPlane file under rank{R}/ for TensorBoard, which the merge names."""
    from tests.conftest import train_job
    prof = tmp_path / "prof"
    out = train_job("gloo", [*digits(framework), "--epochs", "1", "--quiet", "--profile-dir", prof,
                             "--profile-steps", "2:4"], timeout=240)
    assert out["steps"] > 4, out
    if framework == "mxnet":
        assert_profiled(prof, steps=None)
        return
    for rank in (0, 1):
        assert list((prof / f"rank{rank}").glob("plugins/profile/*/*.xplane.pb")), sorted(prof.rglob("*"))
    proc = run([sys.executable, "-m", "toolkit", "profile", "merge", prof], timeout=60)
    assert proc.returncode != 0 and "TensorBoard's profile plugin" in proc.stderr, proc.stderr


def test_profile_steps_is_checked():
    from toolkit.config import load
    from toolkit.errors import ToolkitError
    for bad in ("5", "5:5", "a:b", "-1:3"):
        with pytest.raises(ToolkitError, match=r"profile_steps=.*expected START:END"):
            load(dict(profile_dir="p", profile_steps=bad))
    assert load(dict(profile_steps="0:1")).profile_steps == "0:1"


def test_a_gpus_peak_is_known_by_name():
    from toolkit.run import throughput
    assert throughput.peak(None, "NVIDIA H100 80GB HBM3") == throughput.peak(None, "NVIDIA H200") == 989.0
    assert throughput.peak(None, "NVIDIA A100-SXM4-80GB") == 312.0 and throughput.peak(None, "NVIDIA L4") == 121.0
    assert throughput.peak(None, None) is None and throughput.peak(50.0, "NVIDIA H100") == 50.0
    assert throughput.figures(100.0, 4, None, None, 989.0) == {}


def test_counting_flops_changes_nothing_the_training_computes():
    """The count runs one forward pass in inference mode: BatchNorm's statistics, the training flag and the
    random generator are as they were (Dropout draws nothing), and the count is the matmuls' (BatchNorm's own
    arithmetic is not a FLOP torch counts)."""
    import contextlib
    import types

    import torch

    from toolkit.adapters.torch.session import TorchSession
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 4))
    session = types.SimpleNamespace(model=model, strategy=types.SimpleNamespace(unwrap=lambda m: m),
                                    autocast=contextlib.nullcontext)
    batch = (torch.randn(5, 8), torch.zeros(5, dtype=torch.long))
    state, generator = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    flops, tokens = TorchSession.throughput_basis(session, batch)
    assert flops == 3 * 2 * (8 * 16 + 16 * 4) and tokens is None
    assert model.training and torch.equal(generator, torch.get_rng_state())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert TorchSession.throughput_basis(session, (torch.randint(0, 9, (5, 8)).float(),))[1] is None
