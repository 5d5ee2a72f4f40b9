"""A Spark application for `toolkit launch --launcher spark` and `toolkit.spark.run`: a SparkSession on the
master (spark://HOST:PORT, or any URL Spark takes; none: `local[N]`), after checking that a spark:// master
answers at all (Spark itself retries one that does not for a minute, then fails in a wall of JVM lines). The
executors run this driver's Python (PYSPARK_PYTHON, unless set). The JVM's own output goes to a log file (named
in the one line of a start that failed; removed after the job). Spark retries no failed task
(spark.task.maxFailures 1). And the one line that says why Spark failed.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings
from typing import Optional

from toolkit.errors import ToolkitError
from toolkit.launch import engines

BARRIER_CHECK_S = 5         # --native: how often Spark looks again for slots for every worker


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


class SparkApplication:
    """A SparkSession for a job (or for `toolkit.spark.run`), its JVM's log in a file; `stop()` leaves no JVM behind."""

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
                SparkContext._gateway.shutdown()     # type: ignore[union-attr]  # made_jvm: there is one
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
