"""`toolkit launch --launcher spark`: the job's Spark driver (launchers/spark.py starts it) and `toolkit.spark.run`.

Starts a Spark application (sparkapp.py) on --master (none: `local[N]`, N = -np x --cpus-per-worker, so -np 4
runs on a 2-core laptop as it does under horovodrun); the job's output is the ranks' lines alone (sparklines.py).
Then:

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
import os
import re
import socket
import sys
import threading
import warnings
from typing import Any, Callable, Optional

from toolkit.errors import ToolkitError
from toolkit.launch import engines
from toolkit.launch.hosts import free_port
from toolkit.launch.sparkapp import SparkApplication, last_line, spark_error
from toolkit.launch.sparklines import Lines, exit_line, quiet_threads
from toolkit.launch.spec import LaunchSpec

FAILED, FAILED_LINE = engines.FAILED, engines.FAILED_NOTE        # a worker's note to this driver, not shown


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
        why = last_line(spark_error(caught)) if caught else "see the Spark application's log"  # type: ignore[arg-type]  # caught
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


def _horovod(spec: LaunchSpec, env: dict, cwd: str, session: SparkApplication) -> int:
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


def _native(spec: LaunchSpec, env: dict, cwd: str, session: SparkApplication) -> int:
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
        session = SparkApplication(spec.master, spec.np, spec.cpus_per_worker, spec.gpus_per_worker, spec.start_timeout)
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
    import signal

    import horovod.spark
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
            session = SparkApplication(master, np, start_timeout=start_timeout, name="toolkit.spark.run", flag="master=")
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
