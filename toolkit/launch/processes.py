"""The processes of a launched job: the TensorFlow workers and the torchruns (one per host) the toolkit
starts itself (the first to fail stops the others), a launcher's SIGTERM passed to its local ranks,
whole process groups stopped."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Optional

from toolkit import messages
from toolkit.errors import ToolkitError


def timed_out(timeout: float) -> ToolkitError:
    return ToolkitError(f"launch: the job ran past --timeout {timeout:g}s and was stopped; "
                        "raise --timeout if it needs longer", code=124)


def run_workers(workers, timeout: Optional[float], tagged: bool = False) -> int:
    """Start every worker; the first non-zero exit stops the rest and is the job's exit code. `tagged`:
    each process is a launcher that tags its ranks' lines itself (torchrun): its own lines, its failure
    report among them, are the relay's to settle, and a failed rank's code is the job's."""
    from toolkit.launch.output import Relay

    relay = Relay()
    procs = [subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, errors="replace", bufsize=1) for argv, env in workers]
    forward_sigterm(*procs)
    pumps = [relay.pump(pipe, stream, None if tagged else rank)  # type: ignore[arg-type]  # PIPE: set
             for rank, p in enumerate(procs) for pipe, stream in ((p.stdout, sys.stdout), (p.stderr, sys.stderr))]
    deadline = None if timeout is None else time.monotonic() + timeout
    failed = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = next(((rank, c) for rank, c in enumerate(codes) if c not in (None, 0)), None)
            if failed or all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                raise timed_out(timeout)                # type: ignore[arg-type]  # set: there is a deadline
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 130
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p)
        for pump in pumps:          # the workers are gone: their last lines are in the pipes
            pump.join(timeout=5)
    if tagged:
        return relay.finish(failed[1] if failed else 0)
    return relay.worker_failed(*failed) if failed else 0


def run_relayed(argv, env, timeout: Optional[float]) -> int:
    """One launcher process (horovodrun, mpirun, an engine's driver) in a session of its own, its lines
    relayed (output.py); the job's exit code. Past `timeout` its whole group is stopped (124)."""
    from toolkit.launch.output import Relay

    relay = Relay()
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    pumps = [relay.pump(proc.stdout, sys.stdout), relay.pump(proc.stderr, sys.stderr)]  # type: ignore[arg-type]  # PIPE
    forward_sigterm(proc)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise timed_out(timeout) from None              # type: ignore[arg-type]  # set: it expired
    except KeyboardInterrupt:
        kill_group(proc)
        return 130
    for pump in pumps:
        pump.join(timeout=10)
    return relay.finish(code)


RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "TF_CONFIG", "TORCHELASTIC_RUN_ID")


def local_ranks(proc: subprocess.Popen) -> list:
    """The training processes under `proc` on this host (psutil processes): its descendants that a
    launcher gave a rank (horovodrun's and mpirun's own helpers have none)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    ranks = []
    for p in tree:
        try:
            if any(name in p.environ() for name in RANK_VARIABLES):
                ranks.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ranks


def forward_sigterm(*procs: subprocess.Popen) -> None:
    """SIGTERM to `toolkit launch` (Slurm's and Kubernetes' notice before they stop a job) goes to the
    local ranks themselves, not to the launcher, which would kill them 5 s later (horovodrun): they
    finish their step, rank 0 checkpoints, they exit 75 and so does the job (toolkit/run/preemption.py).
    One rank receiving it is enough: they agree at the next step. A second SIGTERM stops the job."""
    previous: list = []

    def handler(signum, frame):
        if previous:
            for proc in procs:
                kill_group(proc)
            return
        previous.append(signum)
        ranks = [r for proc in procs for r in local_ranks(proc)]
        for p in ranks:
            try:
                p.send_signal(signal.SIGTERM)
            except Exception:       # gone already
                pass
        messages.write(messages.line("launch", f"SIGTERM passed to {len(ranks)} local rank(s); they stop after "
                                               "their step (a second SIGTERM stops the job at once)"))

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:              # not the main thread: leave signals alone
        pass


def kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            time.sleep(0.1)
