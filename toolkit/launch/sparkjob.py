"""`toolkit launch --launcher spark`: the job's Spark driver (started by engines.run_driver) and `toolkit.spark.run`.

Starts a Spark application on --master (spark://HOST:PORT, or any URL Spark takes; none: `local[N]`, N =
-np x --cpus-per-worker, so -np 4 runs on a 2-core laptop as it does under horovodrun), after checking that a
spark:// master answers at all (Spark itself retries one that does not for a minute, then fails in a wall of
JVM lines). The executors run this driver's Python (PYSPARK_PYTHON, unless set). The JVM's own output goes to
a log file (named in the one line of a start that failed; removed after the job), so the job's output is the
ranks' lines alone. Spark retries no failed task (spark.task.maxFailures 1). Then:

- the horovod backend: Horovod's `horovod.spark.run` (one Spark task per worker, Gloo rendezvous at this
  driver; toolkit/shims/horovod_spark.py mends it), each task running the command (engines.run_command) with
  its HOROVOD_* variables; Horovod streams each task's lines back here tagged by the task's index, which is
  dropped for the rank's own tag;
- --backend native (torch): pyspark's `TorchDistributor` (a barrier stage, a torchrun of one process in each
  task); the function is in no process group and runs the command with RANK/WORLD_SIZE/LOCAL_RANK/
  LOCAL_WORLD_SIZE/GROUP_RANK/MASTER_ADDR/MASTER_PORT as torchrun's own ranks have them (`_torch_env`: the
  local rank and size of the host, not of the task, and a fresh port for the command's store). pyspark
  streams the lines back on this driver's stderr; the ranks' `<stdout>` lines are put back on stdout.

A worker whose command exits non-zero stops the others and the job ends with its code (the EXIT line that
settles the relay); a worker whose task, executor or node is lost ends the job with one line and exit 1 (no
elastic on Spark: --resume). Every process a command left is killed with its worker (`_run_reaped`).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from typing import Any, Callable, Optional

from toolkit.errors import ToolkitError
from toolkit.launch import engines
from toolkit.launch.hosts import free_port
from toolkit.launch.launcher import LaunchSpec

FAILED, FAILED_LINE = engines.FAILED, engines.FAILED_NOTE        # a worker's note to this driver, not shown
TASK_TAG = re.compile(r"^\[\d+\]<std(?:out|err)>:")            # Horovod's tag: the Spark task's index
RANK_TAG = re.compile(r"^\[\d+\]<(std(?:out|err))>:")
BARRIER_CHECK_S = 5         # --native: how often Spark looks again for slots for every worker


# ---------------------------------------------------------------------------------------------- the session
def check_master(master: str, flag: str = "--master ") -> None:
    """A spark:// master where nothing listens: one line now (Spark would retry it for a minute)."""
    if not master.startswith("spark://"):
        return
    answered, said = False, ""
    for where in master[len("spark://"):].split(","):
        host, _, port = where.rpartition(":")
        if not host or not port.isdigit():
            raise ToolkitError(f"{flag}{master}: expected spark://HOST:PORT (the master's, 7077 unless it was "
                               "started with another --port), local[N], or another URL Spark takes")
        why = engines.unanswered(host, int(port))
        answered, said = answered or why is None, why or said
    if not answered:
        raise ToolkitError(f"{flag}{master}: no Spark master answers there ({said}); start one with "
                           "`$SPARK_HOME/sbin/start-master.sh` (its log names the spark:// URL) and a worker, "
                           f"or drop {flag.strip()} for a local Spark (local[N])")


class Session:
    """A SparkSession for a job (or for `run`), its JVM's log in a file; `stop()` leaves no JVM behind."""

    def __init__(self, master: Optional[str], np: int, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                 start_timeout: int = 60, name: str = "toolkit launch", flag: str = "--master "):
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession

        cpus = max(1, math.ceil(cpus_per_worker))
        self.master = master or f"local[{np * cpus}]"
        if master:
            check_master(master, flag)
        conf = SparkConf(loadDefaults=False).setMaster(self.master).setAppName(name)
        conf.set("spark.ui.showConsoleProgress", "false")
        conf.set("spark.task.cpus", str(cpus))
        conf.set("spark.task.maxFailures", "1")              # a worker that failed fails the job: no retry
        conf.set("spark.stage.maxConsecutiveAttempts", "1")
        # --backend native: a barrier stage waits for a slot per worker; give up after about --start-timeout
        conf.set("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", f"{BARRIER_CHECK_S}s")
        conf.set("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures",
                 str(max(1, math.ceil(start_timeout / BARRIER_CHECK_S))))
        if gpus_per_worker:
            conf.set("spark.task.resource.gpu.amount", f"{gpus_per_worker:g}")
        if self.master.startswith("local"):
            conf.set("spark.ui.enabled", "false")
        self.log_path, self.proc, self.made_jvm = None, None, SparkContext._gateway is None
        python = os.environ.get("PYSPARK_PYTHON")
        os.environ["PYSPARK_PYTHON"] = python or sys.executable    # the executors run this Python
        try:
            gateway = None
            if self.made_jvm:
                gateway = self._launch(conf)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.context = SparkContext(conf=conf, gateway=gateway)
                self.spark = SparkSession(self.context)
        except ToolkitError:
            raise
        except Exception as exc:
            self._end_jvm()
            raise ToolkitError(f"launch: Spark did not start ({self.master}): {self._why(exc)}", code=1) from None
        except BaseException:       # stopped while it started
            self.stop(at_once=True)
            raise
        finally:
            if python is None:
                os.environ.pop("PYSPARK_PYTHON", None)
            else:
                os.environ["PYSPARK_PYTHON"] = python

    def _launch(self, conf):
        """The JVM, its stdout and stderr (log4j's lines, the JVM's warnings) in a log file."""
        import shutil
        from pyspark.java_gateway import launch_gateway

        if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
            raise ToolkitError("launch: Spark needs Java 17 or newer and none is on PATH (nor JAVA_HOME); "
                               "`toolkit setup --engines spark` installs it (Debian's openjdk-17-jre-headless)")
        fd, self.log_path = tempfile.mkstemp(prefix="toolkit-spark-", suffix=".log")
        # In a session of its own: a SIGTERM to the driver's group (`--timeout`) lets the driver stop the
        # workers through it and end; a driver that is killed closes the JVM's stdin, and it exits.
        with os.fdopen(fd, "w") as log:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": subprocess.STDOUT,
                                                         "start_new_session": True})
        self.proc = gateway.proc
        return gateway

    def _why(self, exc: BaseException) -> str:
        """One line for a failure of Spark's: the JVM's last error in its log, else the exception's last line."""
        said = ""
        if self.log_path and os.path.exists(self.log_path):
            with open(self.log_path, errors="replace") as f:
                errors = [t.strip() for t in f if re.search(r"\b(ERROR|Exception|Error)\b", t)]
            said = errors[-1] if errors else ""
        if not said:
            said = last_line(exc)
        return said + (f" (Spark's log: {self.log_path})" if self.log_path else "")

    def abandon(self) -> None:
        """The driver is being stopped (and may be killed before it can wait for anything): the JVM is told to
        end (its shutdown hook stops the application; it also ends when this process's pipe to it closes),
        its log goes."""
        if self.made_jvm and self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.terminate()
        if self.log_path:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)

    def stop(self, at_once: bool = False) -> None:
        """Stop the application and end its JVM; `at_once` (the driver was stopped, its JVM maybe in the middle
        of a call): end the JVM without asking it (its shutdown hook still stops the application)."""
        if at_once and self.made_jvm and self.proc is not None:
            self.proc.terminate()
        else:
            with contextlib.suppress(Exception):
                self.spark.stop()
        self._end_jvm(at_once)
        if self.log_path:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)

    def _end_jvm(self, at_once: bool = False) -> None:
        """The JVM this session started ends with it (it would at this process's exit, orphaned)."""
        if not self.made_jvm:
            return
        from pyspark import SparkContext

        if not at_once:
            with contextlib.suppress(Exception):
                SparkContext._gateway.shutdown()
        SparkContext._gateway = SparkContext._jvm = None
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()         # the JVM exits on EOF
            try:
                self.proc.wait(timeout=3 if at_once else 20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def last_line(exc: BaseException) -> str:
    """The line of an exception (Python's, or Py4J's with Spark's and the JVM's stack in it) that says what
    went wrong: a Python `SomethingError: ...` in it (a task's own), else Spark's reason for the failed task,
    else its first line."""
    text = str(exc)
    lines = [t.strip() for t in text.splitlines() if t.strip()]
    python = [t for t in lines if re.match(r"^[A-Za-z_]\w*(Error|Exception|Exit|Interrupt)\b", t)]
    if python:
        said = python[-1]
    elif m := re.search(r"most recent failure: Lost task [^\n]*?\): ([^\n]+)", text):
        said = m.group(1)
    elif m := re.search(r"^: [\w.$]+: ([^\n]+)", text, re.M):        # Py4JJavaError: the JVM's exception
        said = m.group(1)
    else:
        said = lines[0] if lines else type(exc).__name__
    return said[:400]


def spark_error(caught: list) -> Optional[BaseException]:
    """Of the exceptions Horovod's threads died with, the one that says why the Spark job failed: Spark's
    report of a failed task, else Spark's own (not its cancelling the job after), else the last."""
    def rank(c):
        return ("most recent failure" in str(c),
                type(c).__module__.startswith(("py4j", "pyspark")) and "cancelled" not in str(c))
    return max(reversed(caught), key=rank) if caught else None


# ------------------------------------------------------------------------------------- the workers' lines
class Lines:
    """A text stream that takes chunks from several threads and writes whole lines: Horovod's task tag
    dropped where the rank's own tag follows (`strip`), `<stdout>` lines sent to `out` (`route`), and a
    worker's failure note kept in `failures` instead of shown."""

    def __init__(self, err, out=None, strip: bool = True, route: bool = False):
        self.err, self.out, self.strip, self.route = err, out or err, strip, route
        self.failures: list[tuple[int, int]] = []
        self.lock, self.local = threading.Lock(), threading.local()
        self.parts: list = []

    def write(self, text: str) -> int:
        part = getattr(self.local, "part", None)
        if part is None:
            part = self.local.part = [""]
            with self.lock:
                self.parts.append(part)
        part[0] += text
        *lines, part[0] = part[0].split("\n")
        for line in lines:
            self._line(line)
        return len(text)

    def _line(self, line: str) -> None:
        if self.strip and (m := TASK_TAG.match(line)) and (RANK_TAG.match(line[m.end():]) or
                                                          FAILED_LINE.match(line[m.end():])):
            line = line[m.end():]
        if m := FAILED_LINE.match(line):
            with self.lock:
                self.failures.append((int(m.group(1)), int(m.group(2))))
            return
        stream = self.out if self.route and (m := RANK_TAG.match(line)) and m.group(1) == "stdout" else self.err
        with self.lock:
            stream.write(line + "\n")
            stream.flush()

    def flush(self) -> None:
        self.err.flush()
        self.out.flush()

    def close(self) -> None:
        """What is left of a line without its newline."""
        for part in self.parts:
            if part[0]:
                self._line(part[0])
                part[0] = ""

    def failed(self) -> Optional[tuple[int, int]]:
        return self.failures[0] if self.failures else None


@contextlib.contextmanager
def quiet_threads():
    """A thread that dies with an exception (Horovod's Spark thread, when the Spark job failed) prints its
    traceback: keep the exceptions for the one line instead."""
    caught: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: caught.append(args.exc_value)
    try:
        yield caught
    finally:
        threading.excepthook = previous


def exit_line(rank: int, code: int) -> int:
    print(engines.EXIT.format(rank=rank, code=code), file=sys.stderr, flush=True)
    return code


# ------------------------------------------------------------------------------------------ in a worker
def _kill_descendants() -> None:
    import psutil

    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            process.kill()


def _run_reaped(command, env, cwd, rank: int) -> int:
    """engines.run_command, leaving none of the command's processes behind: the command's own children are
    this process's once the command is gone (a child subreaper), and are killed when it returns or when
    this process is stopped (Horovod's task service, torchrun and Spark stop a worker with SIGTERM, and
    only the command itself dies with its parent)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)      # PR_SET_CHILD_SUBREAPER (Linux)

    def stopped(signum, frame):         # the driver's stop (--timeout), torchrun's after another rank failed
        _kill_descendants()
        with contextlib.suppress(Exception):
            sys.stderr.write(FAILED.format(rank=rank, code=128 + signum) + "\n")
            sys.stderr.flush()
        os._exit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stopped)
    try:
        return engines.run_command(command, env, cwd, rank)
    finally:
        _kill_descendants()


# --------------------------------------------------------------------------------- the horovod backend
def _command_in_worker(command, env, cwd) -> None:
    """In a Horovod Spark worker: the command, tagged with the worker's Horovod rank; its non-zero code is the
    worker's (Horovod then stops the others) after a note to the driver of which rank failed."""
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    code = _run_reaped(command, env, cwd, rank)
    if code:
        sys.stderr.write(FAILED.format(rank=rank, code=code) + "\n")
        sys.stderr.flush()
        sys.exit(code)


def _horovod_failed(exc: BaseException, caught: list, master: str, np: int, start_timeout: int,
                    flags=("-np {}", "--start-timeout {}", "launch")) -> Optional[ToolkitError]:
    """horovod.spark.run's own failures (not a worker's) in one line; None for a worker's."""
    said = str(exc)
    if said.startswith("Timed out waiting for"):
        np_, timeout = flags[0].format(np), flags[1].format(start_timeout)
        return ToolkitError(f"{flags[2]}: Spark did not start {np_} workers within {timeout} s (one task each, on "
                            f"{master}): the cluster has too few free cores for them; lower {flags[0].format('').strip()}, "
                            f"add workers, or raise {flags[1].format('').strip()}", code=1)
    if said.startswith("Spark job has failed"):
        why = last_line(spark_error(caught)) if caught else "see the Spark application's log"
        if "No module named" in why:
            from pyspark import SparkContext
            python = getattr(SparkContext._active_spark_context, "pythonExec", None) or sys.executable
            why += f" (the executors run {python}: every node needs the same Python environment)"
        return ToolkitError(f"{flags[2]}: the Spark job failed: {why}", code=1)
    if said.startswith("Horovod detected that one or more processes exited"):
        return None
    return ToolkitError(f"{flags[2]}: horovod.spark.run failed: {last_line(exc)}", code=1)


def _lost(exc: BaseException, caught: list) -> ToolkitError:
    """A worker that ended without its command's code (its Spark task, executor or node was lost)."""
    m = re.search(r"Process name: (\S+)\s+Exit code: (\S+)", str(exc))
    who = f"worker {m.group(1)}" if m else "a worker"
    error = spark_error(caught)
    why = last_line(error) if error is not None and "most recent failure" in str(error) else \
        "its Spark task, executor or node went away"
    return ToolkitError(f"launch: {who} was lost ({why}); the job stopped: Spark runs no elastic jobs, the same "
                        "command with --resume continues from the last checkpoint", code=1)


def _horovod(spec: LaunchSpec, env: dict, cwd: str, session: Session) -> int:
    from toolkit.shims import horovod_spark
    horovod_spark.apply()
    import horovod.spark

    out, err = Lines(sys.stdout), Lines(sys.stderr)
    with quiet_threads() as caught:
        try:
            horovod.spark.run(_command_in_worker, args=(list(spec.command), env, cwd), num_proc=spec.np,
                              start_timeout=spec.start_timeout, use_gloo=True, stdout=out, stderr=err, verbose=0)
        except Exception as exc:
            out.close()
            err.close()
            if horovod_spark.stopped():         # --timeout: `toolkit launch` says so itself
                return 128 + 15
            if failed := err.failed():
                return exit_line(*failed)
            raise (_horovod_failed(exc, caught, f"--master {session.master}", spec.np, spec.start_timeout) or
                   _lost(exc, caught)) from None
    out.close()
    err.close()
    return 0


# ---------------------------------------------------------------------------------- the native backend
def _torch_env(timeout: float, per_task: bool) -> tuple[dict, Any]:
    """In a TorchDistributor worker: the command's torch variables, as torchrun's own ranks have them.

    TorchDistributor starts one torchrun per task with --nproc_per_node=1 (one per GPU set with GPUs), so
    each rank is a node of its own to torchrun: LOCAL_RANK 0 and LOCAL_WORLD_SIZE 1 everywhere, even for two
    ranks on one host (each then takes all the host's cores for its threads). On CPUs the ranks tell each
    other their hosts over the rendezvous store (torchrun's agent's, else one rank 0 hosts) and the local
    rank and size are the host's, as under torchrun or horovodrun; with GPUs each task's own view stays
    (CUDA_VISIBLE_DEVICES holds its GPUs alone). Rank 0 picks a fresh MASTER_PORT for the command's own
    store. Returns the variables and the store (kept open while the command runs)."""
    from datetime import timedelta
    from torch.distributed import TCPStore

    rank, size, addr = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"]
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = TCPStore(addr, int(os.environ["MASTER_PORT"]), size, is_master=rank == 0 and not agent,
                     timeout=timedelta(seconds=timeout), wait_for_workers=False)
    if rank == 0:
        store.set("toolkit.spark/port", str(free_port("")))
    store.set(f"toolkit.spark/host/{rank}", socket.gethostname())
    keys = [f"toolkit.spark/host/{r}" for r in range(size)]
    store.wait(keys + ["toolkit.spark/port"])
    hosts = [store.get(k).decode() for k in keys]
    env = {"RANK": str(rank), "WORLD_SIZE": str(size), "MASTER_ADDR": addr,
           "MASTER_PORT": store.get("toolkit.spark/port").decode(), "TORCHELASTIC_USE_AGENT_STORE": "False"}
    if per_task:
        env.update(LOCAL_RANK=os.environ["LOCAL_RANK"], LOCAL_WORLD_SIZE=os.environ["LOCAL_WORLD_SIZE"],
                   GROUP_RANK=os.environ.get("GROUP_RANK", str(rank)))
    else:
        local = [r for r, host in enumerate(hosts) if host == hosts[rank]]
        env.update(LOCAL_RANK=str(local.index(rank)), LOCAL_WORLD_SIZE=str(len(local)),
                   GROUP_RANK=str(list(dict.fromkeys(hosts)).index(hosts[rank])))
    return env, store


def _native_in_worker(config: dict) -> None:
    """In a TorchDistributor task (a torchrun worker, not in a process group): the command as a torchrun rank."""
    torch_env, store = _torch_env(config["timeout"], config["gpus"])
    rank = int(torch_env["RANK"])
    code = _run_reaped(config["command"], dict(config["env"], **torch_env), config["cwd"], rank)
    del store
    if code:
        sys.stderr.write(FAILED.format(rank=rank, code=code) + "\n")
        sys.stderr.flush()
        sys.exit(code)


def _native(spec: LaunchSpec, env: dict, cwd: str, session: Session) -> int:
    from pyspark.ml.torch.distributor import TorchDistributor

    config = {"command": list(spec.command), "env": env, "cwd": cwd, "timeout": spec.start_timeout,
              "gpus": spec.gpus_per_worker > 0}
    lines = Lines(sys.stderr, sys.stdout, strip=False, route=True)
    real = sys.stderr
    sys.stderr = lines          # pyspark's log server writes every task's lines to this driver's stderr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            distributor = TorchDistributor(num_processes=spec.np, local_mode=False, use_gpu=spec.gpus_per_worker > 0)
            distributor.logger.setLevel(logging.WARNING)       # not its "Started/Finished distributed training"
            distributor.run(_native_in_worker, config)
    except Exception as exc:
        sys.stderr = real
        lines.close()
        if failed := lines.failed() or _failed_in(str(exc)):
            return exit_line(*failed)
        said = last_line(exc)
        if "requires more slots than the total number of slots" in str(exc):
            said = (f"Spark has fewer free slots than -np {spec.np} (one task of --cpus-per-worker cores each, "
                    f"on --master {session.master}); lower -np or add workers")
        raise ToolkitError(f"launch: pyspark's TorchDistributor failed: {said}", code=1) from None
    finally:
        sys.stderr = real
    lines.close()
    return 0


def _failed_in(text: str) -> Optional[tuple[int, int]]:
    m = FAILED_LINE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


# ------------------------------------------------------------------------------------------------ entries
class _Stopped(BaseException):
    """SIGTERM to the driver (`toolkit launch --timeout` stops the driver's group)."""


def job(spec: LaunchSpec) -> int:
    """The driver's whole job for `spec`; the job's exit code. Stopped (SIGTERM), it stops the Spark
    application, its tasks and their commands, removes its log and exits 143 without a line of its own
    (`toolkit launch` says why it stopped the job); Horovod's launcher takes SIGTERM while it runs."""
    import signal

    env, cwd = engines.passed_env(spec), os.getcwd()
    session, stopping = None, []

    def stop(signum, frame):
        # the JVM first: pyspark's TorchDistributor waits for its tasks' log connections before it lets go
        stopping.append(signum)
        logging.disable(logging.CRITICAL)       # not py4j's report of each call the JVM's end cut short
        if session is not None:
            session.abandon()
        raise _Stopped()

    signal.signal(signal.SIGTERM, stop)
    try:
        session = Session(spec.master, spec.np, spec.cpus_per_worker, spec.gpus_per_worker, spec.start_timeout)
        if spec.backend == "native":
            return _native(spec, env, cwd, session)
        return _horovod(spec, env, cwd, session)
    except BaseException:
        if stopping:        # whatever the stop made of it (a call into the JVM that went away)
            return 128 + signal.SIGTERM
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)       # the group's SIGKILL comes 5 s after its SIGTERM
        if session is not None:
            session.stop(at_once=bool(stopping))


class _Tagged:
    """In a `run` worker: sys.stdout/sys.stderr whose lines carry the worker's rank (Horovod tags them with
    the Spark task's index, which the driver drops)."""

    def __init__(self, stream, tag: str):
        self.stream, self.tag, self.start = stream, tag, True

    def write(self, text: str) -> int:
        out = "".join((self.tag if self.start or i else "") + t for i, t in enumerate(text.splitlines(True)))
        self.start = text.endswith("\n") if text else self.start
        self.stream.write(out)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _call(fn: Callable[[Any], Any], config: Any) -> Any:
    """In a `run` worker: fn(config), its printed lines tagged with the worker's rank."""
    rank = os.environ.get("HOROVOD_RANK", "0")
    sys.stdout, sys.stderr = _Tagged(sys.stdout, f"[{rank}]<stdout>:"), _Tagged(sys.stderr, f"[{rank}]<stderr>:")
    try:
        return fn(config)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run(fn: Callable[[Any], Any], config: Any = None, *, np: int = 2, master: Optional[str] = None,
        spark: Any = None, start_timeout: int = 60) -> list:
    """`toolkit.spark.run`: `fn(config)` on `np` Horovod workers, one Spark task each, of `spark` (a SparkSession
    you have) or else of a session on `master` (None: local[np]) made for this call and stopped after it;
    returns each worker's result, by rank. The workers' printed lines come here tagged `[rank]<stdout>:`."""
    from toolkit.shims import horovod_spark
    horovod_spark.apply()
    import horovod.spark
    import signal
    from pyspark import SparkContext

    if spark is not None and SparkContext._active_spark_context is None:
        raise ToolkitError("toolkit.spark.run: spark= must be a running classic SparkSession (not Spark Connect's), "
                           "or give master= instead")
    # Horovod's launcher takes SIGINT and SIGTERM for its own stop and keeps them, as pyspark's SparkContext
    # keeps its SIGINT handler: the caller's come back after
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    session, out, err = None, Lines(sys.stdout), Lines(sys.stderr)
    try:
        if spark is None:
            session = Session(master, np, start_timeout=start_timeout, name="toolkit.spark.run", flag="master=")
        with quiet_threads() as caught:
            try:
                return horovod.spark.run(_call, args=(fn, config), num_proc=np, start_timeout=start_timeout,
                                         use_gloo=True, stdout=out, stderr=err, verbose=0)
            except Exception as exc:
                where = f"master {session.master}" if session else "the given SparkSession"
                error = _horovod_failed(exc, caught, where, np, start_timeout,
                                        flags=("np={}", "start_timeout={}", "toolkit.spark.run"))
                if error is None:
                    raise           # a worker failed: Horovod's error names its rank and exit code
                raise error from None
    finally:
        out.close()
        err.close()
        if session is not None:
            session.stop()
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


if __name__ == "__main__":     # by its own name, so the workers unpickle the functions by reference
    from toolkit.launch import sparkjob
    engines.driver_main(sparkjob.job)
