"""Run a LaunchSpec: the launcher it names (launchers.LAUNCHERS: horovodrun, mpirun, TF_CONFIG workers,
torchrun, Ray, Spark) starts the ranks; `commands` is what it would start (`--dry-run`). No framework import
and no MPI needed to build a command: every launcher's argv and environment are pure and unit-tested."""
from __future__ import annotations

from typing import Mapping, Optional

from toolkit.launch.environment import format_command
from toolkit.launch.launchers import LAUNCHERS
from toolkit.launch.launchers.base import Command
from toolkit.launch.spec import LaunchSpec

__all__ = ["LaunchSpec", "commands", "format_command", "run"]


def commands(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> list[Command]:
    """Every process `run` starts, (argv, env) each: one launcher, or one per worker (tf_config) or host (torchrun)."""
    return LAUNCHERS[spec.launcher].commands(spec, environ)


def run(spec: LaunchSpec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the launcher; return the job's exit code. A job over `timeout` seconds is killed (124)."""
    return LAUNCHERS[spec.launcher].run(spec, timeout, environ)
