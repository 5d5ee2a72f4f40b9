"""What `toolkit launch` is asked to start (LaunchSpec), and the rules every launcher shares: a command, -np
within the slots, --env items, ssh's port and key, the flags that belong to one launcher alone, elastic sizes.
Constructing a LaunchSpec checks them, then the chosen launcher's own rules (launchers/<name>.py `check`); a
spec that exists can be run. `choose_launcher` is which launcher --launcher and --backend native ask for."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Optional

from toolkit.errors import ToolkitError
from toolkit.launch.hosts import total_slots
from toolkit.launch.launchers import LAUNCHERS

CONTROLLERS = ("gloo", "mpi")
NATIVE_LAUNCHERS = {"torch": "torchrun", "tensorflow": "tf_config"}    # --backend native: who starts the ranks


@dataclass(frozen=True)
class LaunchSpec:
    command: tuple[str, ...]
    np: int = 1
    hosts: Optional[str] = None          # "a:4,b:4"; default localhost:np
    launcher: str = "horovodrun"         # a name in launchers.LAUNCHERS
    controller: Optional[str] = None     # horovodrun --gloo / --mpi; None = horovodrun's choice
    start_timeout: int = 60              # seconds for all ranks to start (horovodrun)
    network_interface: Optional[str] = None
    env: tuple[str, ...] = ()            # extra KEY=VALUE for every rank
    ssh_port: Optional[int] = None       # for ranks on other hosts
    ssh_identity_file: Optional[str] = None
    extra: tuple[str, ...] = field(default=())   # passed to the launcher verbatim
    # elastic (horovodrun over Gloo, torchrun, Ray): on when min_np or discovery is set
    min_np: Optional[int] = None
    max_np: Optional[int] = None
    discovery: Optional[str] = None      # executable printing `host:slots` lines
    max_restarts: Optional[int] = None   # torchrun elastic: restarts of the worker group (None: 3)
    # Ray and Spark (launchers/engine.py): where the engine runs (None: a local one for the job), each worker's share
    address: Optional[str] = None        # Ray: ADDR (head:6379) or auto
    master: Optional[str] = None         # Spark: spark://host:7077, local[N], ...
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0
    backend: str = "horovod"             # native: Ray Train's TorchTrainer / pyspark's TorchDistributor

    def __post_init__(self):
        if not self.command:
            raise ToolkitError("launch: no command; put it after `--`, e.g. "
                               "`toolkit launch -np 2 -- python examples/train.py`")
        if self.np < 1:
            raise ToolkitError(f"-np {self.np}: must be at least 1")
        if self.launcher not in LAUNCHERS:
            raise ToolkitError(f"--launcher {self.launcher!r}: choose one of {', '.join(LAUNCHERS)}")
        if self.controller is not None and self.controller not in CONTROLLERS:
            raise ToolkitError(f"controller {self.controller!r}: choose --gloo or --mpi")
        if self.start_timeout < 1:
            raise ToolkitError(f"--start-timeout {self.start_timeout}: must be at least 1 second")
        if self.max_restarts is not None and (self.launcher != "torchrun" or self.max_restarts < 0):
            raise ToolkitError(f"--max-restarts {self.max_restarts}: torchrun's restarts of the workers after a "
                               "failure (0 or more), with --backend native --framework torch; drop it otherwise")
        slots = total_slots(self.hosts) if self.hosts else None
        if slots is not None and self.np > slots:
            raise ToolkitError(f"-np {self.np} is more than the {slots} slot(s) in -H {self.hosts}; "
                               f"lower -np or add slots (host:slots)")
        for item in self.env:
            if "=" not in item:
                raise ToolkitError(f"--env {item!r}: expected KEY=VALUE")
        if self.ssh_port is not None and not 0 < self.ssh_port < 65536:
            raise ToolkitError(f"--ssh-port {self.ssh_port}: expected a TCP port, 1-65535")
        if self.ssh_identity_file is not None and not os.path.isfile(self.ssh_identity_file):
            raise ToolkitError(f"--ssh-identity-file {self.ssh_identity_file}: file not found; give the private key "
                               "that opens ssh on the other hosts")
        self._check_owned_flags()
        self._check_elastic()
        LAUNCHERS[self.launcher].check(self)

    def _check_owned_flags(self) -> None:
        """A flag that is one launcher's alone (Ray's --address, Spark's --master, the engines' worker shares)."""
        for other in LAUNCHERS.values():
            for name, flag in other.flags.items():
                if getattr(self, name) is not None and other.name != self.launcher:
                    raise ToolkitError(f"{flag} is {other.title}'s; add --launcher {other.name} (or drop {flag})")
        if not LAUNCHERS[self.launcher].engine and (self.cpus_per_worker, self.gpus_per_worker) != (1, 0):
            raise ToolkitError("--cpus-per-worker/--gpus-per-worker ask Ray or Spark for each worker's share; "
                               "add --launcher ray or spark (or drop them)")

    @property
    def elastic(self) -> bool:
        return self.min_np is not None or self.discovery is not None

    def _check_elastic(self) -> None:
        launcher = LAUNCHERS[self.launcher]
        if not self.elastic:
            if self.max_np is not None:
                raise ToolkitError(f"--max-np applies to elastic jobs; add {launcher.elastic_flags}")
            return
        if not launcher.elastic:
            raise ToolkitError(f"elastic training is horovodrun's or Ray's (Horovod elastic) or torchrun's (--backend "
                               f"native with torch); drop --launcher {self.launcher}")
        low, high = self.min_np or self.np, self.max_np
        if low < 1 or low > self.np or (high is not None and self.np > high):
            raise ToolkitError(f"elastic sizes must satisfy 1 <= --min-np ({low}) <= -np ({self.np}) <= --max-np "
                               f"({high}); fix the one out of order")

    def ssh_options(self) -> list[str]:
        """ssh's own options for -p / -i (mpirun's plm_rsh_args and the tf_config launcher)."""
        return ((["-p", str(self.ssh_port)] if self.ssh_port else []) +
                (["-i", self.ssh_identity_file] if self.ssh_identity_file else []))

    def to_json(self) -> str:
        """The spec as an engine's driver is given it (`from_json` reads it back, checked again)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        fields = json.loads(text)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})  # type: ignore[arg-type]  # to_json's


def choose_launcher(launcher: Optional[str], backend: Optional[str], framework: Optional[str],
                    controller: Optional[str]) -> str:
    """--launcher, or the one --backend native needs for the framework the ranks run (None: unknown)."""
    if backend != "native":
        return launcher or "horovodrun"
    chosen = LAUNCHERS.get(launcher)        # type: ignore[arg-type]  # None: no launcher named
    if chosen is not None and chosen.engine:
        if framework not in (None, "torch"):
            raise ToolkitError(f"--backend native on {launcher} is torch's ({chosen.native}); "  # type: ignore[attr-defined]  # an engine's
                               f"{framework} runs there with --backend horovod")
        return launcher                     # type: ignore[return-value]  # named: it was found
    if chosen is not None and "native" not in chosen.backends:
        raise ToolkitError(f"--backend native starts the framework's own workers (torch: torchrun, tensorflow: "
                           f"TF_CONFIG workers), without Horovod; drop --launcher {launcher}")
    if framework is None:
        if launcher:
            return launcher
        if controller:
            raise ToolkitError(f"--{controller} is a Horovod controller; --backend native runs without "
                               "Horovod: drop it")
        raise ToolkitError("--backend native: torch ranks start with torchrun, TensorFlow's as TF_CONFIG workers, "
                           "and nothing says which the command runs; add --framework torch or --framework tensorflow")
    wanted = NATIVE_LAUNCHERS.get(framework)
    if launcher and wanted and launcher != wanted:
        raise ToolkitError(f"--launcher {launcher} does not start {framework}'s native workers; drop it "
                           f"(--backend native with {framework} uses {wanted})")
    return launcher or wanted               # type: ignore[return-value]  # the framework's backends include native
