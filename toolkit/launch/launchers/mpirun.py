"""The mpirun launcher (`--launcher mpirun`): plain Open MPI `mpirun` starts every rank on -H's hosts, passing
the ranks' variables (`-x`) and ssh's options; Horovod's ranks then run over MPI. No elastic, no Gloo."""
from __future__ import annotations

import os
import shutil
from typing import Mapping, Optional

from toolkit.errors import ToolkitError
from toolkit.launch.environment import passed_names, worker_env
from toolkit.launch.hosts import check_hosts
from toolkit.launch.launchers.base import Command, Launcher
from toolkit.launch.processes import run_relayed


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def plan(spec, environ: Mapping[str, str] | None = None) -> Command:
    """mpirun's argv and environment for `spec`."""
    env = worker_env(spec, environ)
    argv = ["mpirun"]
    if is_root():
        argv.append("--allow-run-as-root")
    argv += ["-np", str(spec.np), "-H", spec.hosts or f"localhost:{spec.np}", "-bind-to", "none", "-map-by", "slot",
             "--tag-output", "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    if spec.network_interface:
        argv += ["-mca", "btl_tcp_if_include", spec.network_interface]
    if spec.ssh_options():
        argv += ["-mca", "plm_rsh_args", " ".join(spec.ssh_options())]
    for name in passed_names(env):
        argv += ["-x", name]
    return argv + list(spec.extra) + list(spec.command), env


class Mpirun(Launcher):
    name = "mpirun"

    def check(self, spec) -> None:
        if spec.controller == "gloo":
            raise ToolkitError("--gloo needs horovodrun; drop --gloo or use --launcher horovodrun")

    def output_flags(self, verbose: bool, output: str | None) -> list[str]:
        """Open MPI's own: DIR/1/rank.N/stdout and stderr per rank."""
        return (["--verbose"] if verbose else []) + (["--output-filename", output] if output else [])

    def commands(self, spec, environ: Mapping[str, str] | None = None) -> list[Command]:
        return [plan(spec, environ)]

    def run(self, spec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
        check_hosts(spec)
        argv, env = plan(spec, environ)
        if shutil.which(argv[0], path=env.get("PATH")) is None:
            raise ToolkitError(f"launch: {argv[0]} not found on PATH; install Open MPI (apt-get install openmpi-bin)")
        return run_relayed(argv, env, timeout)
