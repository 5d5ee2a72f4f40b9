"""What the Ray and Spark launchers share: the engine places the workers itself (no -H, no controller: Horovod's
ranks meet over Gloo), and `toolkit launch` starts the engine's driver (`python -m toolkit.launch.rayjob` or
`toolkit.launch.sparkjob`, given the LaunchSpec as JSON) in its own session and relays its lines as
horovodrun's (toolkit/launch/engines.py says what the driver and the workers do)."""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

from toolkit.errors import ToolkitError
from toolkit.launch.environment import worker_env
from toolkit.launch.launchers.base import Command, Launcher
from toolkit.launch.processes import run_relayed


class EngineLauncher(Launcher):
    engine = True
    backends = ("horovod", "native")
    driver = ""             # the driver's module, run with `python -m`
    native = ""             # what runs torch's ranks with --backend native

    def check(self, spec) -> None:
        if spec.hosts is not None:
            raise ToolkitError(f"-H/--hostfile: {self.name} places the workers on its own nodes; drop it "
                               f"({' '.join(self.flags.values())} names the cluster)")
        if spec.controller is not None:
            raise ToolkitError(f"--{spec.controller}: on {self.name} Horovod's ranks meet over Gloo; drop it")
        if spec.cpus_per_worker <= 0 or spec.gpus_per_worker < 0:
            raise ToolkitError(f"--cpus-per-worker {spec.cpus_per_worker:g} / --gpus-per-worker "
                               f"{spec.gpus_per_worker:g}: CPUs must be more than 0 and GPUs 0 or more")
        if spec.backend not in ("horovod", "native"):
            raise ToolkitError(f"--backend {spec.backend!r}: choose horovod or native")

    def commands(self, spec, environ: Mapping[str, str] | None = None) -> list[Command]:
        """The engine's driver, which starts the workers."""
        return [([sys.executable, "-m", self.driver, spec.to_json()], worker_env(spec, environ))]

    def run(self, spec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
        """Start the engine's driver for `spec`, relay its lines, return the job's exit code."""
        env = dict(os.environ if environ is None else environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("RAY_DEDUP_LOGS", "0")       # every rank's lines, not "[repeated 2x across cluster]"
        return run_relayed([sys.executable, "-m", self.driver, spec.to_json()], env, timeout)
