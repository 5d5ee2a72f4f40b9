"""What the Ray and Spark drivers share: the driver's `__main__`, its report of a failed worker, and the
command run in each worker.

`toolkit launch --launcher ray|spark` starts a driver (`python -m toolkit.launch.rayjob` or
`toolkit.launch.sparkjob`, given the LaunchSpec as JSON: launchers/engine.py) in its own session and relays
its output as horovodrun's: the engine forwards each worker's lines to the driver (Ray prefixes them with
`(Actor pid=N, ip=A)`, which the relay drops), the worker has tagged them `[rank]<stdout>:` itself.
The driver prints its own failures as one `toolkit: error:` line and exits non-zero; --timeout stops
the driver's whole process group, and the engine then stops the workers it owned (their commands die
with them: `run_command` asks the kernel for SIGKILL when the worker that started them goes).

In the worker (a Ray actor, a Spark task), `run_command` runs the user's command as a child process
with the engine's rank variables (Horovod's HOROVOD_*, torch's RANK/WORLD_SIZE/MASTER_*), in the
directory `toolkit launch` ran in (a path every node sees, as checkpoints need), tags its lines, and
returns its exit code.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

from toolkit.errors import ToolkitError
from toolkit.launch.environment import passed_names, worker_env
from toolkit.launch.spec import LaunchSpec

EXIT = "toolkit: launch: worker {rank} exited with code {code}"   # a driver's report; output.py holds it back as horovodrun's
# A worker's note to its driver that its command failed (in an exception or a log line; never shown).
FAILED = "toolkit-command-failed rank={rank} code={code}"
FAILED_NOTE = re.compile(r"toolkit-command-failed rank=(\d+) code=(\d+)")


def unanswered(host: str, port: int) -> str | None:
    """None when something accepts a TCP connection at host:port within 5 s, else why not (the engines'
    own clients retry a dead address for a minute or for ever: the drivers look first)."""
    try:
        socket.create_connection((host.strip("[]"), port), timeout=5).close()
        return None
    except OSError as exc:
        return exc.strerror or str(exc)


def passed_env(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables each worker's command gets from here (the node keeps its own for the rest): the
    toolkit's, Horovod's, the framework's settings, PATH/PYTHONPATH/VIRTUAL_ENV, and --env items."""
    env = worker_env(spec, environ)
    return {k: env[k] for k in passed_names(env)}


def _die_with_parent() -> None:
    """In the command's process, before exec: SIGKILL when the worker that started it dies (Linux)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_command(command: Sequence[str], env: Mapping[str, str], cwd: str, rank: int) -> int:
    """In a worker: run `command` with this process's environment and `env`, in `cwd`; its lines go to
    this process's stdout/stderr tagged `[rank]<stdout>:` / `[rank]<stderr>:`; returns its exit code
    (128 + N for signal N). A missing `cwd` or command is the command's failure, one line."""
    full = {**os.environ, **env}
    if not os.path.isdir(cwd):
        sys.stderr.write(f"[{rank}]<stderr>:toolkit: error: launch: {cwd} does not exist on this node "
                         f"({os.uname().nodename}); run from a folder every node sees (a shared filesystem)\n")
        sys.stderr.flush()
        return 2
    try:
        proc = subprocess.Popen(list(command), env=full, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", bufsize=1, preexec_fn=_die_with_parent)
    except OSError as exc:
        sys.stderr.write(f"[{rank}]<stderr>:toolkit: error: launch: cannot run {command[0]!r} on "
                         f"{os.uname().nodename}: {exc.strerror}\n")
        sys.stderr.flush()
        return 127

    def copy(pipe, stream, name):
        for text in iter(pipe.readline, ""):
            stream.write(f"[{rank}]<{name}>:{text if text.endswith(chr(10)) else text + chr(10)}")
            stream.flush()

    threads = [threading.Thread(target=copy, args=(proc.stdout, sys.stdout, "stdout"), daemon=True),
               threading.Thread(target=copy, args=(proc.stderr, sys.stderr, "stderr"), daemon=True)]
    for t in threads:
        t.start()
    code = proc.wait()
    for t in threads:
        t.join(timeout=10)
    time.sleep(0.5)         # the engine forwards a worker's lines from its log file, a moment behind
    return 128 - code if code < 0 else code


def driver_main(run) -> None:
    """A driver's `__main__`: `run(spec)` returns the job's exit code; a ToolkitError is one line."""
    from toolkit.messages import line

    spec = LaunchSpec.from_json(sys.argv[1])
    try:
        code = run(spec)
    except ToolkitError as exc:
        sys.stderr.write(line("error", str(exc)) + "\n")
        sys.stderr.flush()
        code = exc.code
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)      # not the engine's atexit hooks: the driver's job is done
