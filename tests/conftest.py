"""Shared helpers: run the CLI and real multi-rank jobs as subprocesses, always with a timeout; the `fw`
fixture (a framework whose Horovod imports); a job started in the background, one of its ranks killed,
and the job stopped with its whole process tree (`started`, `kill_rank`, `stop`)."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAIN = [sys.executable, str(ROOT / "examples" / "train.py")]
BIN = Path(sys.executable).parent
FRAMEWORKS = ["torch", "tensorflow", "mxnet"]
if os.environ.get("TOOLKIT_TEST_JOBLOG"):
    from tests import joblog
    joblog.install(os.environ["TOOLKIT_TEST_JOBLOG"])


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


@functools.lru_cache(maxsize=None)
def horovod_status(fw: str):
    """None when horovod.<fw> imports, else why; probed in a subprocess (keeps this one light)."""
    from toolkit.install import horovod as horovod_build
    return horovod_build.extension_status([fw])[fw]


@pytest.fixture(params=FRAMEWORKS)
def fw(request):
    why = horovod_status(request.param)
    if why:
        pytest.skip(f"horovod.{request.param} does not import ({why}); run `make setup`")
    return request.param


def digits(fw):
    return ["--framework", fw, "--dataset", "digits"]


def rank_process(marker: str, rank: int | None = None, host: str | None = None, cpu_s: float = 0.0):
    """The training process (examples/train.py) of a running job whose command line holds `marker`: the
    one of `rank` (HOROVOD_RANK, or OMPI_COMM_WORLD_RANK under mpirun) and on `host` (HOROVOD_HOSTNAME)
    where given, past `cpu_s` seconds of user CPU; None while there is none."""
    import psutil
    for p in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(p.info["cmdline"] or [])
            if marker not in line or "examples/train.py" not in line:
                continue
            env = p.environ()
            if rank is not None and str(rank) not in (env.get("HOROVOD_RANK"), env.get("OMPI_COMM_WORLD_RANK")):
                continue
            if host is not None and env.get("HOROVOD_HOSTNAME") != host:
                continue
            if not cpu_s or p.cpu_times().user > cpu_s:
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def kill_rank(marker: str, sig: int = signal.SIGKILL, **which) -> None:
    """Send `sig` to one rank of a running job (`rank_process(marker, **which)`), which must exist."""
    process = rank_process(marker, **which)
    assert process is not None, f"no process {which} in the job of {marker}"
    process.send_signal(sig)


def stop(job: subprocess.Popen) -> None:
    """Kill a job started with `start_new_session=True`, if it still runs, and reap it: every process
    under it first (`toolkit launch` starts horovodrun in a session of its own), then its process group."""
    if job.poll() is None:
        import psutil
        try:
            children = psutil.Process(job.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


@contextlib.contextmanager
def started(argv, **popen):
    """`with started(argv, ...) as job:` a job in a session of its own (text, stdout piped; `popen`
    overrides), stopped with everything it started when the block ends (`stop`), however it ends."""
    job = subprocess.Popen([str(a) for a in argv], **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                                                      "text": True, "env": clean_env(), "cwd": ROOT, **popen},
                           start_new_session=True)
    try:
        yield job
    finally:
        stop(job)


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLKIT_", "HOROVOD_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(argv, timeout=300, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(), cwd=cwd or ROOT)


EXIT_ABORT = "terminate called without an active exception"


def run_native(argv, **kw) -> subprocess.CompletedProcess:
    """run() for a user's own script on torch's native backend. torch 2.14 keeps the Gloo process group alive
    past destroy_process_group once DDP was built on it (its threads still run at exit), and such a
    process, rarely, aborts in its exit after its work is done (docs/NATIVE.md, "Known limits"): two such runs
    aborted in one CI run (1,012 tests), none of 119 in loops here. That run is repeated once; a second abort, or any
    other failure, fails the test. The toolkit's own commands end without Python's teardown and never abort."""
    proc = run(argv, **kw)
    if proc.returncode != 0 and EXIT_ABORT in proc.stderr:
        proc = run(argv, **kw)
    return proc


def toolkit(*args, **kw) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "toolkit", *args], **kw)


def summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-4000:]}"
    # horovodrun tags each line with the rank: "[0]<stdout>:" (gloo) or "[1,0]<stdout>:" (MPI)
    lines = [ln for ln in re.sub(r"\[[\d,]+\]<stdout>:", "", proc.stdout).splitlines() if ln.startswith("{")]
    assert len(lines) == 1, f"expected one JSON line on stdout, got {proc.stdout!r}"
    return json.loads(lines[0])


def train_job(launcher: str, args, np_: int = 2, timeout: int = 300, env=None, direct: bool = False) -> dict:
    """One real training job: 'single', 'gloo' / 'mpi' (horovodrun), 'mpirun', or 'native' (torch's own
    engine under torchrun: `toolkit launch --backend native`). Launched through `toolkit launch` (its
    horovodrun starts ~3 s sooner), or with `direct` the plain horovodrun command."""
    if launcher == "single":
        argv = TRAIN + list(args)
    elif launcher == "native":
        argv = [sys.executable, "-m", "toolkit", "launch", "-np", np_, "--backend", "native", "--framework", "torch",
                "--timeout", timeout - 10, "--", *TRAIN, "--backend", "native", *args]
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
    """The CLI's contract for bad input: non-zero exit and exactly one line on stderr, the
    `toolkit: error:` line (no traceback, no framework logs, no warnings).

    With `launched`, the output is horovodrun's: each rank's lines are tagged `[rank]<stderr>:`, and
    horovodrun itself prints a traceback when a rank fails, so each rank's lines are checked: one
    error line per rank, at most (a rank stopped by the launcher first may print none, or the
    `Terminated` notice of the shell horovodrun runs it in).
    """
    assert proc.returncode != 0, f"expected failure, got exit 0: {proc.stdout}"
    if launched:
        by_rank: dict = {}
        for rank, line in re.findall(r"^\[(?:\d+,)?(\d+)\]<stderr>:(.*)$", proc.stderr, re.M):
            if line.strip() != "Terminated":
                by_rank.setdefault(rank, []).append(line)
        assert by_rank, f"no rank wrote to stderr:\n{proc.stderr}"
        for rank, lines in by_rank.items():
            assert len(lines) == 1 and lines[0].startswith("toolkit: error: "), \
                f"rank {rank} wrote more than its one error line:\n" + "\n".join(lines)
        errors = [lines[0] for lines in by_rank.values()]
    else:
        errors = proc.stderr.splitlines()
        assert len(errors) == 1 and errors[0].startswith("toolkit: error: "), \
            f"expected exactly one `toolkit: error:` line on stderr, got:\n{proc.stderr}"
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


def assert_replicas(out: dict, replicas: int = 2) -> None:
    """Every replica started from its own weights and all of them ended with the same ones (the
    digests come from every rank, gathered before the summary; the trainer's own check is unit-tested)."""
    assert len(out["initial_digests"]) == replicas and len(set(out["initial_digests"])) == replicas, \
        f"replicas must start from different weights so the broadcast is really tested: {out['initial_digests']}"
    assert len(out["final_digests"]) == replicas and len(set(out["final_digests"])) == 1, \
        f"replicas ended different: {out['final_digests']}"
    assert out["final_digests"][0] == out["param_digest"]


def timeline_ops(path) -> dict:
    """{(tensor name, dtype, shape): times} for every collective in a Horovod timeline (rank 0
    writes it; each op ends with an event carrying the tensor's dtype and shape). The file of a job
    that has just ended may lack its closing bracket."""
    text = Path(path).read_text().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names, ops = {}, {}
    for e in events:
        args = e.get("args", {})
        if e.get("name") == "process_name" and "name" in args:
            names[e["pid"]] = args["name"]
        elif e.get("ph") == "E" and "dtype" in args:
            key = (names[e["pid"]], args["dtype"], args["shape"])
            ops[key] = ops.get(key, 0) + 1
    return ops


def timeline_exchange(path) -> dict:
    """{kind: [output shape of each op]} for the alltoall and allgather ops in a Horovod timeline that
    are not the toolkit's own named ones: the gradient exchange's collectives over the whole job."""
    text = Path(path).read_text().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names, out = {}, {"alltoall": [], "allgather": []}
    for e in events:
        args = e.get("args", {})
        if e.get("name") == "process_name" and "name" in args:
            names[e["pid"]] = args["name"]
        elif e.get("ph") == "B" and e.get("name") in ("ALLTOALL", "ALLGATHER"):
            name = names[e["pid"]]
            if "toolkit." not in name:
                out[e["name"].lower()].append(None)
        elif e.get("ph") == "E" and "shape" in args and "toolkit." not in names[e["pid"]]:
            kind = "allgather" if "allgather" in names[e["pid"]].lower() else None
            if kind and out[kind] and out[kind][-1] is None:
                out[kind][-1] = json.loads(args["shape"])
    return out


DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint8": 1, "int8": 1}


def timeline_gradient_bytes(path) -> tuple[int, set]:
    """(bytes, dtypes) of every allreduce in the timeline except the toolkit's own named ones
    (losses, metrics): what Horovod really reduced for the gradients, over the whole job.
    torch names an op `allreduce.<tensor>`, MXNet `horovod_allreduce.<index>`; TensorFlow by its graph op
    (`HorovodAllreduce_<gradient>`, `HorovodGroupedAllreduce_...` from Keras's fit path); the toolkit's
    own carry `toolkit.` in their names."""
    total, dtypes = 0, set()
    for (name, dtype, shape), times in timeline_ops(path).items():
        gradient = name.startswith(("allreduce.", "horovod_allreduce.")) or name.startswith("HorovodGroupedAllreduce_") \
            or name.startswith("HorovodAllreduce_")
        if gradient and "toolkit." not in name:
            values = 1
            for n in json.loads(shape):
                values *= n
            total += times * values * DTYPE_BYTES[dtype]
            dtypes.add(dtype)
    return total, dtypes
