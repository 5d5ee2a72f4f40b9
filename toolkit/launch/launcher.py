"""argv + environment for `horovodrun`, plain `mpirun`, TensorFlow's own workers or torchrun, with timeouts.

No framework import and no MPI needed to build a command: `plan()`, `plan_workers()` and
`plan_torchrun()` are pure and unit-tested. The `tf_config` launcher (`toolkit launch --backend
native` for TensorFlow) starts one process per worker itself (over ssh for other hosts) with each
one's TF_CONFIG, for MultiWorkerMirroredStrategy; the first worker to fail stops the others.

The `torchrun` launcher (`--backend native` for torch: torch.distributed) starts one torchrun per
host (`python -m torch.distributed.run` of this Python), over ssh for other hosts as TF workers
are: one host runs `--standalone`; several meet at a c10d rendezvous on the first host (a free
port when it is this machine, else TORCHRUN_PORT; --start-timeout is its join_timeout). torchrun
has one --nproc-per-node for every host, so -np must fill the hosts it uses (in -H order, as
horovodrun fills slots) equally. The command runs as given (`--no-python`); each rank's lines are
tagged with its global rank and shown as horovodrun's (`[1]<stderr>:`, output.py). Elastic
(--min-np/--max-np) counts whole hosts: `--nnodes MIN:MAX --max-restarts 3`; torchrun restarts
every worker after a failure or a change of hosts, and the restarted ranks run the command from
the top: they continue from the newest checkpoint when their config names a checkpoint_dir
(torchrun's TORCHELASTIC_RESTART_COUNT says they were restarted; nothing else survives a restart).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import socket
import sys
import uuid
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from toolkit.errors import ToolkitError
from toolkit.launch.hosts import check_hosts, free_port, is_local, parse_hosts, total_slots
from toolkit.launch.processes import run_relayed, run_workers

LAUNCHERS = ("horovodrun", "mpirun", "tf_config", "torchrun", "ray", "spark")
ENGINES = ("ray", "spark")      # cluster engines that place the workers themselves (engines.py)
TF_CONFIG_BASE_PORT = 23456     # worker s on a remote host listens on base + s (local workers: free ports)
TORCHRUN_PORT = 29400           # the rendezvous on a first host that is another machine (torchrun's default)
TORCHRUN_MAX_RESTARTS = 3       # elastic: restarts of the worker group before the job fails
# The prefix torchrun writes before each rank's line (its --tee); output.py makes it `[rank]<stdout|stderr>:`.
TORCHRUN_TAG = "[${rank}]<std>:"
CONTROLLERS = ("gloo", "mpi")
# Variables every rank needs to see the same Python environment and the toolkit's settings.
# TensorFlow's own by name: a bare `TF_` prefix also caught other tools' (Terraform's TF_CLI_CONFIG_FILE).
_PASS_PREFIXES = ("TOOLKIT_", "HOROVOD_", "NCCL_", "OMP_", "MXNET_", "TF_CPP_", "TF_XLA_", "TF_GPU_", "TF_FORCE_",
                  "TF_NUM_", "TF_ENABLE_")
_PASS_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "TF_USE_LEGACY_KERAS",
               "TF_DETERMINISTIC_OPS", "TF_CONFIG")


@dataclass(frozen=True)
class LaunchSpec:
    command: tuple[str, ...]
    np: int = 1
    hosts: Optional[str] = None          # "a:4,b:4"; default localhost:np
    launcher: str = "horovodrun"
    controller: Optional[str] = None     # horovodrun --gloo / --mpi; None = horovodrun's choice
    start_timeout: int = 60              # seconds for all ranks to start (horovodrun)
    network_interface: Optional[str] = None
    env: tuple[str, ...] = ()            # extra KEY=VALUE for every rank
    ssh_port: Optional[int] = None       # for ranks on other hosts
    ssh_identity_file: Optional[str] = None
    extra: tuple[str, ...] = field(default=())   # passed to the launcher verbatim
    # Horovod elastic (horovodrun over Gloo): on when min_np or discovery is set
    min_np: Optional[int] = None
    max_np: Optional[int] = None
    discovery: Optional[str] = None      # executable printing `host:slots` lines
    # Ray and Spark (engines.py): where the engine runs (None: a local one for the job), each worker's share
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
        if self.launcher == "mpirun" and self.controller == "gloo":
            raise ToolkitError("--gloo needs horovodrun; drop --gloo or use --launcher horovodrun")
        if self.launcher == "tf_config" and self.controller is not None:
            raise ToolkitError(f"--{self.controller} is a Horovod controller; TensorFlow's native workers "
                               "(--backend native) talk through TF_CONFIG: drop it")
        if self.launcher == "torchrun" and self.controller is not None:
            raise ToolkitError(f"--{self.controller} is a Horovod controller; torchrun's ranks (--backend native) "
                               "meet at its own rendezvous: drop it")
        if self.start_timeout < 1:
            raise ToolkitError(f"--start-timeout {self.start_timeout}: must be at least 1 second")
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

        if self.launcher == "torchrun":
            torchrun_nodes(self)            # -np fills the hosts it uses equally
        self._check_engine()
        self._check_elastic()

    def _check_engine(self) -> None:
        """Ray and Spark place the workers themselves; their flags belong to them alone."""
        if self.address is not None and self.launcher != "ray":
            raise ToolkitError("--address is Ray's; add --launcher ray (or drop --address)")
        if self.master is not None and self.launcher != "spark":
            raise ToolkitError("--master is Spark's; add --launcher spark (or drop --master)")
        if self.launcher not in ENGINES:
            if (self.cpus_per_worker, self.gpus_per_worker) != (1, 0):
                raise ToolkitError("--cpus-per-worker/--gpus-per-worker ask Ray or Spark for each worker's share; "
                                   "add --launcher ray or spark (or drop them)")
            return
        if self.hosts is not None:
            raise ToolkitError(f"-H/--hostfile: {self.launcher} places the workers on its own nodes; drop it "
                               f"({'--address' if self.launcher == 'ray' else '--master'} names the cluster)")
        if self.controller is not None:
            raise ToolkitError(f"--{self.controller}: on {self.launcher} Horovod's ranks meet over Gloo; drop it")
        if self.cpus_per_worker <= 0 or self.gpus_per_worker < 0:
            raise ToolkitError(f"--cpus-per-worker {self.cpus_per_worker:g} / --gpus-per-worker "
                               f"{self.gpus_per_worker:g}: CPUs must be more than 0 and GPUs 0 or more")
        if self.backend not in ("horovod", "native"):
            raise ToolkitError(f"--backend {self.backend!r}: choose horovod or native")

    @property
    def elastic(self) -> bool:
        return self.min_np is not None or self.discovery is not None

    def _check_elastic(self) -> None:
        if not self.elastic:
            if self.max_np is not None:
                raise ToolkitError("--max-np applies to elastic jobs; add --min-np" +
                                   ("" if self.launcher == "torchrun" else " or --host-discovery-script"))
            return
        if self.launcher not in ("horovodrun", "torchrun", "ray"):
            raise ToolkitError(f"elastic training is horovodrun's or Ray's (Horovod elastic) or torchrun's (--backend "
                               f"native with torch); drop --launcher {self.launcher}")
        if self.launcher == "ray" and (self.discovery is not None or self.backend == "native"):
            raise ToolkitError("elastic on Ray is Horovod's elastic Ray executor: Ray finds the hosts (drop "
                               "--host-discovery-script) and it runs the horovod backend (drop --backend native)")
        if self.launcher == "torchrun" and self.discovery is not None:
            raise ToolkitError("--host-discovery-script is Horovod elastic's; torchrun has none (its nodes join "
                               "at the rendezvous, --min-np/--max-np bound them): drop it")
        if self.controller == "mpi":
            raise ToolkitError("Horovod elastic runs over Gloo only; drop --mpi")
        low, high = self.min_np or self.np, self.max_np
        if low < 1 or low > self.np or (high is not None and self.np > high):
            raise ToolkitError(f"elastic sizes must satisfy 1 <= --min-np ({low}) <= -np ({self.np}) <= --max-np "
                               f"({high}); fix the one out of order")
        if self.launcher == "torchrun":
            per = torchrun_nodes(self)[0][1]
            for flag, value in (("--min-np", low), ("--max-np", high)):
                if value is not None and value % per:
                    raise ToolkitError(f"{flag} {value}: torchrun's elastic unit is a node of {per} rank(s) (-np "
                                       f"{self.np} on -H {self.hosts or f'localhost:{self.np}'}); give a multiple "
                                       f"of {per}")
            return
        if self.launcher == "ray":
            return
        if self.discovery is None:
            if len(parse_hosts(self.hosts or "localhost:1")) < 2:
                raise ToolkitError("elastic training needs --host-discovery-script, or -H with at least two hosts")
        elif not (os.path.isfile(self.discovery) and os.access(self.discovery, os.X_OK)):
            raise ToolkitError(f"host discovery script {self.discovery}: not an executable file; it must print "
                               "`host:slots` lines (chmod +x it)")

    def ssh_options(self) -> list[str]:
        """ssh's own options for -p / -i (mpirun's plm_rsh_args and the tf_config launcher)."""
        return ((["-p", str(self.ssh_port)] if self.ssh_port else []) +
                (["-i", self.ssh_identity_file] if self.ssh_identity_file else []))


def tuning_env(fusion_threshold_mb: Optional[float] = None, cycle_time_ms: Optional[float] = None,
               autotune: bool = False, timeline: Optional[str] = None) -> tuple[str, ...]:
    """Horovod's tuning as the variables every rank reads (works under horovodrun and mpirun alike;
    the same config keys in a rank's own config override them)."""
    env = []
    if fusion_threshold_mb is not None:
        if fusion_threshold_mb < 0:
            raise ToolkitError(f"--fusion-threshold-mb {fusion_threshold_mb:g}: must be 0 (fusion off) or more")
        env.append(f"HOROVOD_FUSION_THRESHOLD={int(fusion_threshold_mb * 1024 * 1024)}")
    if cycle_time_ms is not None:
        if cycle_time_ms <= 0:
            raise ToolkitError(f"--cycle-time-ms {cycle_time_ms:g}: must be more than 0")
        env.append(f"HOROVOD_CYCLE_TIME={cycle_time_ms:g}")
    if autotune:
        env.append("HOROVOD_AUTOTUNE=1")
    if timeline:
        env.append(f"HOROVOD_TIMELINE={os.path.abspath(timeline)}")
    return tuple(env)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _passed_names(environ: Mapping[str, str]) -> list[str]:
    return sorted(k for k in environ if k in _PASS_NAMES or k.startswith(_PASS_PREFIXES))


def worker_env(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every rank starts with: the caller's, `--env` items, unbuffered output."""
    env = dict(os.environ if environ is None else environ)
    env.update(item.split("=", 1) for item in spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Launched from a virtualenv (`.venv/bin/toolkit launch`), the job uses that environment:
    # its bin/ holds horovodrun and the python the ranks should run, active or not.
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p)
    return env


def plan(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The launcher's argv and environment for `spec` (horovodrun or mpirun)."""
    env = worker_env(spec, environ)
    hosts = spec.hosts or f"localhost:{spec.np}"
    if spec.launcher == "horovodrun":
        where = ["--host-discovery-script", os.path.abspath(spec.discovery)] if spec.discovery else ["-H", hosts]
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
    else:
        argv = ["mpirun"]
        if _is_root():
            argv.append("--allow-run-as-root")
        argv += ["-np", str(spec.np), "-H", hosts, "-bind-to", "none", "-map-by", "slot", "--tag-output",
                 "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
        if spec.network_interface:
            argv += ["-mca", "btl_tcp_if_include", spec.network_interface]
        if spec.ssh_options():
            argv += ["-mca", "plm_rsh_args", " ".join(spec.ssh_options())]
        for name in _passed_names(env):
            argv += ["-x", name]
    return argv + list(spec.extra) + list(spec.command), env


def plan_workers(spec: LaunchSpec, environ: Mapping[str, str] | None = None,
                 port=free_port) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, env) per TensorFlow worker: hosts filled slot by slot, as horovodrun fills them."""
    base = worker_env(spec, environ)
    places = [(host, s) for host, slots in parse_hosts(spec.hosts or f"localhost:{spec.np}")
              for s in range(slots)][:spec.np]
    workers = [f"{host}:{port() if is_local(host) else TF_CONFIG_BASE_PORT + s}" for host, s in places]
    out = []
    for index, (host, _) in enumerate(places):
        env = dict(base, TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                               "task": {"type": "worker", "index": index}}))
        argv = list(spec.extra) + list(spec.command)
        if not is_local(host):
            argv = _over_ssh(spec, host, argv, env, ["TF_CONFIG"])
        out.append((argv, env))
    return out


def _over_ssh(spec: LaunchSpec, host: str, argv: list[str], env: Mapping[str, str], names: Sequence[str]) -> list[str]:
    """`argv` on `host` through ssh, in this directory, with the variables every rank is passed and `names`."""
    # PATH: this virtualenv's bin/ first, then the remote host's own PATH (expanded there),
    # so a bare `python` is the venv's, as on this host.
    names = [k for k in _passed_names(env) if k != "PATH"] + list(names)
    remote_path = f'PATH={shlex.quote(os.path.dirname(sys.executable))}:"$PATH"'
    line = " ".join(["cd", shlex.quote(os.getcwd()), "&&", "env", remote_path] +
                    [f"{k}={shlex.quote(env[k])}" for k in sorted(set(names))] +
                    [shlex.quote(a) for a in argv])
    return ["ssh", "-o", "BatchMode=yes", *spec.ssh_options(), host, line]


def torchrun_nodes(spec: LaunchSpec) -> list[tuple[str, int]]:
    """(host, ranks) per host torchrun runs on: -np fills the hosts' slots in order (horovodrun's rule);
    torchrun starts the same number on each (one --nproc-per-node), so the hosts it uses must come out equal."""
    hosts = spec.hosts or f"localhost:{spec.np}"
    nodes, left = [], spec.np
    for host, slots in parse_hosts(hosts):
        if left <= 0:
            break
        nodes.append((host, min(slots, left)))
        left -= nodes[-1][1]
    counts = [n for _, n in nodes]
    if len(set(counts)) > 1:
        whole = counts[0] * (len(counts) - 1)
        raise ToolkitError(f"-np {spec.np} on -H {hosts} puts {'+'.join(map(str, counts))} ranks on its hosts, but "
                           f"torchrun starts the same number on each (--nproc-per-node): use -np {whole}, or give "
                           "every host the same slots and -np a multiple of them")
    return nodes


def torchrun_size(spec: LaunchSpec, nodes: int, per_node: int) -> list[str]:
    """--nnodes for `nodes` hosts of `per_node` ranks; elastic: the range of nodes and the restarts."""
    if not spec.elastic:
        return ["--nnodes", str(nodes)]
    low = (spec.min_np or spec.np) // per_node
    high = spec.max_np // per_node if spec.max_np else nodes
    return ["--nnodes", f"{low}:{high}", "--max-restarts", str(TORCHRUN_MAX_RESTARTS)]


def plan_torchrun(spec: LaunchSpec, environ: Mapping[str, str] | None = None, port=free_port,
                  job_id: Optional[str] = None) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, env) per host: one torchrun each (this Python's torch.distributed.run), the command as given."""
    env = worker_env(spec, environ)
    nodes = torchrun_nodes(spec)
    per = nodes[0][1]
    if per > 1:     # what torchrun sets itself, after a 4-line banner saying so
        env.setdefault("OMP_NUM_THREADS", "1")
    ifname = {}
    if spec.network_interface:
        ifname = {"GLOO_SOCKET_IFNAME": spec.network_interface, "NCCL_SOCKET_IFNAME": spec.network_interface}
        env.update(ifname)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    tail = ["--tee", "3", "--log-line-prefix-template", TORCHRUN_TAG, *spec.extra, "--no-python", *spec.command]
    if len(nodes) == 1 and not spec.elastic:
        argvs = [torchrun + ["--standalone", "--nproc-per-node", str(per)] + tail]
    else:
        first = nodes[0][0]
        if is_local(first):     # the others reach this machine by its name
            remote = any(not is_local(host) for host, _ in nodes)
            endpoint = f"{socket.gethostname() if remote else 'localhost'}:{port()}"
        else:
            endpoint = f"{first}:{TORCHRUN_PORT}"
        rendezvous = torchrun_size(spec, len(nodes), per) + [
            "--nproc-per-node", str(per), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", job_id or f"toolkit-{uuid.uuid4().hex[:12]}",
            "--rdzv-conf", f"join_timeout={spec.start_timeout}"]
        argvs = [torchrun + rendezvous + tail for _ in nodes]
    return [(argv if is_local(host) else _over_ssh(spec, host, argv, env, list(ifname)), env)
            for (host, _), argv in zip(nodes, argvs)]


def format_command(argv: Sequence[str], env: Mapping[str, str], base: Mapping[str, str]) -> str:
    """A shell line a user can paste: changed variables first, then the command."""
    changed = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if base.get(k) != v]
    return " ".join(changed + [shlex.quote(a) for a in argv])


def command_line(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """What `run` starts (and `--dry-run` prints): `plan`'s horovodrun as `python -m toolkit.launch.horovodrun`
    when Horovod is installed here (the same horovodrun, started about 3 s sooner)."""
    argv, env = plan(spec, environ)
    if argv[0] == "horovodrun" and importlib.util.find_spec("horovod") is not None:
        argv = [sys.executable, "-m", "toolkit.launch.horovodrun", *argv[1:]]
    return argv, env


def commands(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> list[tuple[list[str], dict[str, str]]]:
    """Every process `run` starts, (argv, env) each: one launcher, or one per worker (tf_config) or host (torchrun)."""
    if spec.launcher == "tf_config":
        return plan_workers(spec, environ)
    if spec.launcher == "torchrun":
        return plan_torchrun(spec, environ)
    if spec.launcher in ENGINES:    # the engine's driver, which starts the workers
        from toolkit.launch import engines
        return [([sys.executable, "-m", engines.DRIVERS[spec.launcher], engines.spec_json(spec)],
                 worker_env(spec, environ))]
    return [command_line(spec, environ)]


def run(spec: LaunchSpec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the launcher; return the job's exit code. A job over `timeout` seconds is killed (124)."""
    if spec.launcher in ENGINES:
        from toolkit.launch import engines
        return engines.run_driver(spec, timeout, environ)
    if spec.launcher == "tf_config":
        check_hosts(spec)
        return run_workers(plan_workers(spec, environ), timeout)
    if spec.launcher == "torchrun":
        check_hosts(spec)
        if any(is_local(host) for host, _ in torchrun_nodes(spec)) and importlib.util.find_spec("torch") is None:
            raise ToolkitError(f"launch: torchrun is torch's; torch is not installed in {sys.executable} "
                               "(pip install torch)")
        return run_workers(plan_torchrun(spec, environ), timeout, tagged=True)
    check_hosts(spec)
    argv, env = command_line(spec, environ)
    if argv[0] != sys.executable and shutil.which(argv[0], path=env.get("PATH")) is None:
        from toolkit.build import support
        fix = support.fix("toolkit build-horovod") if argv[0] == "horovodrun" else \
            "install Open MPI (apt-get install openmpi-bin)"
        raise ToolkitError(f"launch: {argv[0]} not found on PATH; {fix}")
    return run_relayed(argv, env, timeout)
