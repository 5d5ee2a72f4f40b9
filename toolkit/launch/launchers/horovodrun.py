"""The horovodrun launcher (the default): one `horovodrun` starts every rank, over Gloo or MPI, on -H's hosts
or elastically (Horovod elastic: --min-np/--max-np with -H of two hosts or more, or --host-discovery-script).
It runs as `python -m toolkit.launch.horovodrun` when Horovod is installed here (toolkit/launch/horovodrun.py:
the same horovodrun, started about 3 s sooner)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import Mapping, Optional

from toolkit.errors import ToolkitError
from toolkit.launch.environment import worker_env
from toolkit.launch.hosts import check_hosts, parse_hosts
from toolkit.launch.launchers.base import Command, Launcher
from toolkit.launch.processes import run_relayed


def plan(spec, environ: Mapping[str, str] | None = None) -> Command:
    """horovodrun's argv and environment for `spec`."""
    env = worker_env(spec, environ)
    where = ["--host-discovery-script", os.path.abspath(spec.discovery)] if spec.discovery else \
        ["-H", spec.hosts or f"localhost:{spec.np}"]
    argv = ["horovodrun", "-np", str(spec.np), *where, "--start-timeout", str(spec.start_timeout)]
    if spec.elastic:
        argv += ["--min-np", str(spec.min_np or spec.np)]
        argv += ["--max-np", str(spec.max_np)] if spec.max_np else []
    if spec.controller:
        argv.append(f"--{spec.controller}")
    if spec.network_interface:
        argv += ["--network-interface", spec.network_interface]
    if spec.ssh_port:
        argv += ["--ssh-port", str(spec.ssh_port)]
    if spec.ssh_identity_file:
        argv += ["--ssh-identity-file", spec.ssh_identity_file]
    return argv + list(spec.extra) + list(spec.command), env


def command_line(spec, environ: Mapping[str, str] | None = None) -> Command:
    """What `run` starts (and `--dry-run` prints): `plan`'s horovodrun as `python -m toolkit.launch.horovodrun`
    when Horovod is installed here (the same horovodrun, started about 3 s sooner)."""
    argv, env = plan(spec, environ)
    if importlib.util.find_spec("horovod") is not None:
        argv = [sys.executable, "-m", "toolkit.launch.horovodrun", *argv[1:]]
    return argv, env


class Horovodrun(Launcher):
    name = "horovodrun"
    elastic = True

    def check(self, spec) -> None:
        if not spec.elastic:
            return
        if spec.controller == "mpi":
            raise ToolkitError("Horovod elastic runs over Gloo only; drop --mpi")
        if spec.discovery is None:
            if len(parse_hosts(spec.hosts or "localhost:1")) < 2:
                raise ToolkitError("elastic training needs --host-discovery-script, or -H with at least two hosts")
        elif not (os.path.isfile(spec.discovery) and os.access(spec.discovery, os.X_OK)):
            raise ToolkitError(f"host discovery script {spec.discovery}: not an executable file; it must print "
                               "`host:slots` lines (chmod +x it)")

    def output_flags(self, verbose: bool, output: str | None) -> list[str]:
        """horovodrun's own: DIR/rank.N/stdout and stderr per rank."""
        return (["--verbose"] if verbose else []) + (["--output-filename", output] if output else [])

    def commands(self, spec, environ: Mapping[str, str] | None = None) -> list[Command]:
        return [command_line(spec, environ)]

    def run(self, spec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
        check_hosts(spec)
        argv, env = command_line(spec, environ)
        if argv[0] != sys.executable and shutil.which(argv[0], path=env.get("PATH")) is None:
            from toolkit.install import support
            raise ToolkitError(f"launch: {argv[0]} not found on PATH; {support.fix('toolkit build-horovod')}")
        return run_relayed(argv, env, timeout)
