"""`toolkit launch --launcher spark` and `toolkit.spark.run` on a real standalone Spark cluster (issue 38): a
master and one worker (2 cores) started here from pyspark's own classes, on 127.0.0.1 only, shared by every
test of the module and stopped with their process groups after. The Horovod backend trains the README's job
to Horovod's own digest (horovodrun's, same run), the native backend (TorchDistributor) to identical
replicas and torchrun's digest; a failed command ends the job with its code in one line, the others
stopped; a --master where nothing listens is one line; `toolkit.spark.run` returns every rank's result.
After each test no driver, JVM, executor or command of the job is left. Skipped without pyspark or Java
unless TOOLKIT_REQUIRE_ENGINES=1 (`make test`), which makes that a failure."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,
    TRAIN,
    assert_replicas,
    clean_env,
    horovod_status,
    one_line_error,
    run,
    summary,
    train_job,
)

DIGITS = ["--framework", "torch", "--dataset", "digits", "--epochs", "2"]
FAIL_MARK = "spark-test-failing-rank"
# What a job may leave behind, by command line (the other processes on this machine are not the test's).
LEFTOVERS = ("toolkit.launch.sparkjob", "org.apache.spark.deploy.SparkSubmit", "CoarseGrainedExecutorBackend",
             "horovod.spark.task.gloo_exec_fn", "pyspark.ml.torch.torch_run_process_wrapper", "pyspark.daemon",
             FAIL_MARK)


def _engines_missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (toolkit setup --engines spark)"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "Spark needs Java 17+ and there is none (toolkit setup --engines spark)"
    if horovod_status("torch"):
        return f"horovod.torch does not import ({horovod_status('torch')})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_class() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue
    try:        # the group's last members (an executor the worker started) after its leader
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"{proc.args[1]} exited {proc.returncode}:\n{path.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} in {path} after {timeout} s:\n{path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """spark://127.0.0.1:PORT: a standalone master and one worker of 2 cores and 2 GiB, real processes in
    process groups of their own; the worker registered before the tests start."""
    missing = _engines_missing()
    if missing:
        if os.environ.get("TOOLKIT_REQUIRE_ENGINES") == "1":
            pytest.fail(f"TOOLKIT_REQUIRE_ENGINES=1 and {missing}")
        pytest.skip(missing)
    home = _spark_class().parent.parent
    logs = tmp_path_factory.mktemp("spark")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    env = clean_env(SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(logs),
                    SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",       # no REST server on port 6066
                    SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=false")
    started = []

    def start(name, *args):
        log = logs / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([str(_spark_class()), *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=logs, start_new_session=True)
        started.append(proc)
        return proc, log

    try:
        master, master_log = start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", "0")
        _wait_for(master_log, "I have been elected leader", master, 90)
        worker, _ = start("worker", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                          "--cores", "2", "--memory", "2g", "--webui-port", "0", "--work-dir", str(logs / "work"))
        _wait_for(master_log, "Registering worker 127.0.0.1:", master, 90)
        yield url
    finally:
        for proc in reversed(started):
            _stop(proc)


def _leftovers() -> list[str]:
    import psutil
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if any(mark in line for mark in LEFTOVERS) and p.info["pid"] != os.getpid():
            found.append(f"{p.info['pid']}: {line[:160]}")
    return found


@pytest.fixture(autouse=True)
def nothing_left():
    """After each test: no driver, driver JVM, executor (the master ends an application's executors a moment
    after its driver goes), task or command of the test's jobs is still running."""
    yield
    deadline = time.monotonic() + 30
    while (left := _leftovers()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, "processes left behind:\n" + "\n".join(left)


def spark_launch(master, *args, timeout=240, env=None):
    argv = [sys.executable, "-m", "toolkit", "launch", "--launcher", "spark", "--master", master, *args]
    return run(argv, timeout=timeout, env=env or clean_env(SPARK_LOCAL_IP="127.0.0.1"))


@pytest.mark.distributed
def test_the_readme_job_trains_on_the_spark_cluster_as_under_horovodrun_and_torchrun(cluster):
    """Horovod backend (horovod.spark.run): exit 0, every rank's lines tagged as horovodrun's, rank 0's summary on
    stdout, 2 workers ending identical, on the digest horovodrun gives the same job. --backend native
    (TorchDistributor): identical replicas, on the digest torchrun (`toolkit launch --backend native`) gives."""
    proc = spark_launch(cluster, "-np", "2", "--timeout", "200", "--", *TRAIN, *DIGITS)
    out = summary(proc)
    assert out["world_size"] == 2 and out["backend"] == "horovod", out
    assert_replicas(out)
    assert re.search(r"^\[0\]<stderr>:epoch 2/2 ", proc.stderr, re.M), proc.stderr[-3000:]
    assert re.search(r"^\[0\]<stdout>:\{", proc.stdout, re.M), proc.stdout[-3000:]
    # nothing of Spark's own (its JVM's log is a file) or Horovod's between the ranks' lines
    untagged = [t for t in proc.stderr.splitlines() + proc.stdout.splitlines() if not re.match(r"^\[\d\]<std", t)]
    assert not untagged, untagged
    hvd = train_job("gloo", DIGITS, timeout=200)
    assert out["param_digest"] == hvd["param_digest"], (out["param_digest"], hvd["param_digest"])

    native = summary(spark_launch(cluster, "--backend", "native", "--framework", "torch", "-np", "2",
                                  "--timeout", "200", "--", *TRAIN, *DIGITS))
    assert native["world_size"] == 2 and native["backend"] == "native", native
    assert "DistributedDataParallel" in native["path"], native["path"]
    assert_replicas(native)
    torchrun = train_job("native", DIGITS, timeout=200)
    assert native["param_digest"] == torchrun["param_digest"], (native["param_digest"], torchrun["param_digest"])


def _timed_lines(argv, timeout, env):
    """Run argv; (exit code, [(seconds after start, stdout line)], stderr, seconds it ran)."""
    start = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    try:
        lines = [(time.monotonic() - start, t.rstrip("\n")) for t in proc.stdout]
        code = proc.wait()
    finally:
        timer.cancel()
    reader.join()
    return code, lines, err[0], time.monotonic() - start


@pytest.mark.distributed
def test_a_failed_command_ends_the_job_with_its_code_in_one_line_and_stops_the_others(cluster):
    """Rank 1 exits 3 after 8 s; rank 0 would sleep for 300 s: the job ends (well before) with code 3, the
    relay's one line naming rank 1, and rank 0's command is stopped (`nothing_left`). The ranks' lines come
    as they are printed, not when the job ends."""
    code = (f"import os, sys, time  # {FAIL_MARK}\n"
            "rank = os.environ['HOROVOD_RANK']\n"
            "print('rank', rank, 'started', flush=True)\n"
            "time.sleep(8)\n"
            "sys.exit(3) if rank == '1' else time.sleep(300)")
    argv = [sys.executable, "-m", "toolkit", "launch", "--launcher", "spark", "--master", cluster, "-np", "2",
            "--timeout", "100", "--", sys.executable, "-c", code]
    exit_code, lines, stderr, took = _timed_lines(argv, 110, clean_env(SPARK_LOCAL_IP="127.0.0.1"))
    proc = subprocess.CompletedProcess(argv, exit_code, "\n".join(t for _, t in lines), stderr)
    assert exit_code == 3, (exit_code, proc.stdout, stderr)
    one_line_error(proc, "rank 1", "code 3")
    assert took < 60, f"the failed job took {took:.0f} s"
    arrived = dict((t, when) for when, t in lines)
    assert set(arrived) == {"[0]<stdout>:rank 0 started", "[1]<stdout>:rank 1 started"}, lines
    assert took - max(arrived.values()) > 5, f"the ranks' lines came at {lines}, the job ended at {took:.1f} s"


@pytest.mark.distributed
def test_a_master_where_nothing_listens_is_one_line():
    port = _free_port()
    start = time.monotonic()
    proc = spark_launch(f"spark://127.0.0.1:{port}", "-np", "2", "--", "true", timeout=60)
    assert time.monotonic() - start < 60
    one_line_error(proc, f"--master spark://127.0.0.1:{port}", "no Spark master answers")


RUN_FN = textwrap.dedent("""
    import json, sys
    import toolkit.spark

    def fn(config):
        import horovod.torch as hvd, torch
        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + config["add"])]), op=hvd.Sum)
        print("worker", hvd.rank(), "of", hvd.size())
        return {"rank": hvd.rank(), "size": hvd.size(), "sum": float(total[0])}

    import signal
    before = signal.getsignal(signal.SIGINT)
    print("RESULT " + json.dumps(toolkit.spark.run(fn, {"add": 1}, np=2, master=sys.argv[1])))
    assert signal.getsignal(signal.SIGINT) is before, "Ctrl-C no longer stops the caller"
""")


@pytest.mark.distributed
def test_toolkit_spark_run_returns_every_ranks_result(cluster, tmp_path):
    script = tmp_path / "use_spark.py"
    script.write_text(RUN_FN)
    proc = run([sys.executable, script, cluster], timeout=180, env=clean_env(SPARK_LOCAL_IP="127.0.0.1"),
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(next(t for t in proc.stdout.splitlines() if t.startswith("RESULT "))[len("RESULT "):])
    assert result == [{"rank": 0, "size": 2, "sum": 3.0}, {"rank": 1, "size": 2, "sum": 3.0}], result
    assert "[0]<stdout>:worker 0 of 2" in proc.stdout and "[1]<stdout>:worker 1 of 2" in proc.stdout, proc.stdout
