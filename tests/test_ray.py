"""`toolkit launch --launcher ray` and `toolkit.ray.run` on a real Ray cluster of two nodes on this machine
(issue 38): a head and a second node started with `ray start` (two raylets, real processes, one CPU each,
so two workers land one on each), at 127.0.0.1 and 127.0.0.2 (loopback both), token authentication on
as Ray 2.60's default. Every process the fixture started is stopped at the end.

One job per claim group: the built-in script on digits gives the same digest as under horovodrun with
identical replicas, through Horovod's RayExecutor and through Ray Train's TorchTrainer (--backend native);
`toolkit.ray.run` returns each worker's result from two nodes; a worker killed mid-run ends a static job
with one line and a non-zero exit within 60 s, and is replaced in an elastic one (world sizes 2, 1, 2);
an address where no Ray runs is one line.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import BIN, TRAIN, clean_env, digits, horovod_status, started, toolkit
from tests.test_elastic import EPOCH, Lines, epoch_on

pytestmark = pytest.mark.distributed
RAY = BIN / "ray"
NEED = os.environ.get("TOOLKIT_REQUIRE_ENGINES") == "1"


def _skip_or_fail(why: str):
    if NEED:
        pytest.fail(why)
    pytest.skip(why)


def _summary(stdout: str) -> dict:
    lines = [ln.split("<stdout>:", 1)[1] for ln in stdout.splitlines() if "<stdout>:{" in ln]
    assert len(lines) == 1, stdout[-3000:]
    return json.loads(lines[0])


def _stop_cluster(folders) -> None:
    """Every process of the cluster: those whose command line names one of its folders (raylets, GCS),
    those started with its RAY_TMPDIR (agents and workers rename themselves `ray::...`), their children."""
    import psutil
    for _ in range(3):
        found = set()
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if any(f in " ".join(p.info["cmdline"] or []) for f in folders) or \
                        p.environ().get("RAY_TMPDIR") in folders:
                    found |= {p, *p.children(recursive=True)}
        for p in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(found, timeout=10)
        if not found:
            return


@pytest.fixture(scope="module")
def cluster():
    if not shutil.which(str(RAY)):
        _skip_or_fail("ray is not installed: `toolkit setup --engines ray` (make test installs it)")
    if why := horovod_status("torch"):
        _skip_or_fail(f"horovod.torch does not import: {why}")
    folders = [tempfile.mkdtemp(prefix="tkray", dir="/tmp") for _ in range(2)]   # short: Ray's socket paths
    token = os.path.join(folders[0], "token")
    with open(token, "w") as f:
        f.write(secrets.token_hex(32))
    env = clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token, RAY_USAGE_STATS_ENABLED="0")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    try:
        for argv, folder in (([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                               "--include-dashboard", "false"], folders[0]),
                             ([RAY, "start", "--address", address, "--node-ip-address", "127.0.0.2"], folders[1])):
            proc = subprocess.run([str(a) for a in argv] + ["--num-cpus", "1", "--disable-usage-stats",
                                                            "--temp-dir", folder],
                                  env=dict(env, RAY_TMPDIR=folder), capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        yield address, env
    finally:
        _stop_cluster(folders)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_trains_digits_as_horovodrun_does_through_each_backend_and_from_python(cluster, tmp_path):
    address, env = cluster
    job = [*TRAIN, *digits("torch"), "--epochs", "2"]
    # the same topology under horovodrun: two hosts of one rank each (threads per rank follow the ranks per host)
    baseline = _summary(toolkit("launch", "-np", "2", "-H", "localhost:1,127.0.0.1:1", "--gloo", "--network-interface",
                                "lo", "--timeout", "300", "--", *job, timeout=330).stdout)
    assert baseline["world_size"] == 2 and len(set(baseline["final_digests"])) == 1, baseline

    proc = toolkit("launch", "--launcher", "ray", "--address", address, "-np", "2", "--timeout", "300", "--", *job,
                   "--checkpoint-dir", tmp_path / "ckpt", env=env, timeout=330)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*")), "no checkpoint in the folder both nodes see"
    result = _summary(proc.stdout)
    assert result["world_size"] == 2 and result["backend"] == "horovod", result
    assert result["final_digests"] == [baseline["param_digest"]] * 2, (result, baseline["param_digest"])
    assert "pid=" not in proc.stdout + proc.stderr, "Ray's prefix reached the user"     # lines as horovodrun's
    assert re.search(r"^\[0\]<stderr>:epoch 2/2 ", proc.stderr, re.M), proc.stderr[-2000:]

    proc = toolkit("launch", "--launcher", "ray", "--address", address, "--backend", "native", "--framework", "torch",
                   "-np", "2", "--timeout", "300", "--", *job, env=env, timeout=330)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    native = _summary(proc.stdout)
    assert native["backend"] == "native" and native["world_size"] == 2, native
    assert native["final_digests"] == [baseline["param_digest"]] * 2, (native, baseline["param_digest"])

    script = tmp_path / "fn.py"
    script.write_text(
        "import sys, toolkit.ray\n"
        "def fn(config):\n"
        "    import horovod.torch as hvd, ray, torch\n"
        "    hvd.init()\n"
        "    total = hvd.allreduce(torch.tensor([1.0 + hvd.rank()]), op=hvd.Sum).item()\n"
        "    return [hvd.rank(), hvd.size(), ray.util.get_node_ip_address(), total, config]\n"
        "print('RESULT', toolkit.ray.run(fn, {'lr': 0.1}, np=2, address=sys.argv[1]))\n")
    proc = subprocess.run([sys.executable, str(script), address], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = eval(proc.stdout.split("RESULT", 1)[1])
    assert [r[:2] for r in results] == [[0, 2], [1, 2]] and [r[3:] for r in results] == [[3.0, {"lr": 0.1}]] * 2
    assert len({r[2] for r in results}) == 2, results      # one worker on each node


def _start(address, env, config, *flags):
    argv = [sys.executable, "-m", "toolkit", "launch", "--launcher", "ray", "--address", address, "-np", "2",
            *flags, "--timeout", "300", "--", *TRAIN, *digits("torch"), "--config", config]
    return started(argv, stderr=subprocess.STDOUT, env=env)


def _kill_rank(config, rank: int) -> None:
    import psutil
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            line = " ".join(p.info["cmdline"] or [])
            if str(config) in line and "examples/train.py" in line and "toolkit" not in line.split()[1:3] \
                    and p.environ().get("HOROVOD_RANK") == str(rank):
                p.kill()
                return
    raise AssertionError(f"no rank {rank} of {config} runs")


def test_a_killed_ray_worker_ends_a_static_job_in_one_line_and_is_replaced_in_an_elastic_one(cluster, tmp_path):
    address, env = cluster
    config = tmp_path / "slow.yaml"
    config.write_text("epochs: 6\nstraggler: '0:60,1:60'\n")
    with _start(address, env, config) as job:
        out = Lines(job.stdout)
        out.wait(lambda ln: EPOCH.search(ln) or re.search(r"epoch 1/6 ", ln), "a first epoch")
        _kill_rank(config, 1)
        t_kill = time.monotonic()
        code = job.wait(timeout=60)
        took = time.monotonic() - t_kill
    said = [ln for ln in out.lines if ln and "toolkit: error:" in ln]
    assert code != 0 and took < 60, (code, took, out.tail())
    assert len(said) == 1 and "rank 1" in said[0] and "137" in said[0], out.tail()
    assert not any(ln and ln.startswith("Traceback") for ln in out.lines), out.tail()

    with _start(address, env, config, "--min-np", "1", "--max-np", "2") as job:
        out = Lines(job.stdout)
        first = out.wait(epoch_on(2), "an epoch on 2 workers")
        mark = len(out.lines)
        _kill_rank(config, 1)
        # The job resets onto 1 worker; Ray may start the replacement before that worker ends an epoch, so
        # the proof of the shrink is the reset line, and the proof of the growth an epoch on 2 after it.
        out.wait(lambda ln: re.search(r": 1 rank\(s\) x ", ln), "a reset onto 1 worker after the kill",
                 since=mark)
        out.wait(epoch_on(2, after=first), "an epoch on 2 workers again", timeout=120)
        code = job.wait(timeout=240)
    assert code == 0, out.tail()
    result = json.loads(next(ln for ln in out.lines if ln and "<stdout>:{" in ln).split("<stdout>:", 1)[1])
    assert result["elastic"]["world_sizes"] == [2, 1, 2], result["elastic"]
    assert len(result["final_digests"]) == 2 and len(set(result["final_digests"])) == 1, result
    assert any(ln and "worker 1 exited with code 137; the elastic job goes on" in ln for ln in out.lines), out.tail()


def test_an_address_where_no_ray_runs_is_one_line(cluster):
    t0 = time.monotonic()
    proc = toolkit("launch", "--launcher", "ray", "--address", f"127.0.0.1:{_free_port()}", "-np", "2", "--",
                   "true", timeout=60)
    assert proc.returncode != 0 and time.monotonic() - t0 < 60
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "--address" in lines[0] and "ray start --head" in lines[0], lines
