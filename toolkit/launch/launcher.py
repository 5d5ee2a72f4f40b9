"""argv + environment for `horovodrun`, plain `mpirun`, or TensorFlow's own workers, with timeouts.

No framework import and no MPI needed to build a command: `plan()` and `plan_workers()` are pure
and unit-tested. The `tf_config` launcher (`toolkit launch --backend native`) starts one process
per worker itself (over ssh for other hosts) with each one's TF_CONFIG, for
MultiWorkerMirroredStrategy; the first worker to fail stops the others.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from toolkit import messages
from toolkit.errors import ToolkitError

LAUNCHERS = ("horovodrun", "mpirun", "tf_config")
TF_CONFIG_BASE_PORT = 23456     # worker s on a remote host listens on base + s (local workers: free ports)
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

        self._check_elastic()

    @property
    def elastic(self) -> bool:
        return self.min_np is not None or self.discovery is not None

    def _check_elastic(self) -> None:
        if not self.elastic:
            if self.max_np is not None:
                raise ToolkitError("--max-np applies to elastic jobs; add --min-np or --host-discovery-script")
            return
        if self.launcher != "horovodrun":
            raise ToolkitError(f"elastic training is horovodrun's (Horovod elastic); drop --launcher {self.launcher}")
        if self.controller == "mpi":
            raise ToolkitError("Horovod elastic runs over Gloo only; drop --mpi")
        low, high = self.min_np or self.np, self.max_np
        if low < 1 or low > self.np or (high is not None and self.np > high):
            raise ToolkitError(f"elastic sizes must satisfy 1 <= --min-np ({low}) <= -np ({self.np}) <= --max-np "
                               f"({high}); fix the one out of order")
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


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """"a:4,b:4" -> [("a", 4), ("b", 4)]; a host without slots has 1 (horovodrun's rule)."""
    out = []
    for item in hosts.split(","):
        item = item.strip()
        name, _, slots = item.partition(":")
        if not name:
            raise ToolkitError(f"-H {hosts!r}: empty host name; write host:slots[,host:slots]")
        try:
            count = int(slots) if slots else 1
        except ValueError:
            raise ToolkitError(f"-H {hosts!r}: slots of {name!r} must be an integer, e.g. {name}:4") from None
        if count < 1:
            raise ToolkitError(f"-H {hosts!r}: {name} has {count} slots; give at least 1")
        out.append((name, count))
    return out


def total_slots(hosts: str) -> int:
    return sum(slots for _, slots in parse_hosts(hosts))


def read_hostfile(path: str) -> str:
    """A hostfile (`host slots=N` as mpirun and horovodrun write it, or `host:N`, or `host`; `#`
    comments) as the -H string "host:N,...", so every launcher and recipe reads one format."""
    if not os.path.isfile(path):
        raise ToolkitError(f"--hostfile {path}: file not found; check the path")
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            name, slots = words[0], "1"
            if ":" in name:
                name, slots = name.split(":", 1)
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key not in ("slots", "max_slots", "max-slots") or not value:
                    raise ToolkitError(f"--hostfile {path}, line {number}: {word!r} not understood; write "
                                       f"`{name} slots=N` or `{name}:N`")
                if key == "slots":
                    slots = value
            hosts.append(f"{name}:{slots}")
    if not hosts:
        raise ToolkitError(f"--hostfile {path}: no hosts in it; write one `host slots=N` a line")
    text = ",".join(hosts)
    parse_hosts(text)       # the same checks as -H
    return text


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


def check_hosts(spec: LaunchSpec) -> None:
    """Before any launcher starts: every host of -H/--hostfile has an address, and every other host's
    ssh port takes a connection within --start-timeout (all hosts at once). One line naming the first
    host that fails; without this, mpirun prints a 20-line banner, horovodrun's ssh check takes up to
    five 10-second tries (and is skipped for an hour once it passed), and a host that drops packets
    holds ssh for TCP's two minutes. Whether ssh then logs in is left to the launcher."""
    hosts = [host for host, _ in parse_hosts(spec.hosts or "localhost:1")]
    for host in hosts:
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            raise ToolkitError(f"launch: cannot reach {host}: the name does not resolve ({reason}); check the host "
                               f"names in -H/--hostfile", code=1) from None
    remote = [host for host in dict.fromkeys(hosts) if not _is_this_machine(host)]
    if not remote:
        return
    if shutil.which("ssh") is None:
        raise ToolkitError(f"launch: ssh not found on PATH; the ranks on {remote[0]} are started over ssh "
                           "(apt-get install openssh-client)", code=1)
    with ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
        failures = [why for why in pool.map(lambda host: _ssh_port_answers(host, spec), remote) if why]
    if failures:
        raise ToolkitError(f"launch: cannot reach {failures[0]}", code=1)


def _is_this_machine(host: str) -> bool:
    """A name of this machine: by name, or because one of its addresses is on this machine (binding
    to it works), as horovodrun and mpirun treat it: started without ssh."""
    if _is_local(host):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def _ssh_port_answers(host: str, spec: LaunchSpec) -> str | None:
    """None when `host`'s ssh port (as ssh's own configuration resolves it: `ssh -G`) takes a TCP
    connection within --start-timeout; else what went wrong, starting with the host's name. Hosts
    reached through a ProxyJump or ProxyCommand are left to ssh."""
    try:
        shown = subprocess.run(["ssh", "-G", *spec.ssh_options(), host], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        shown = ""
    config = dict(line.split(" ", 1) for line in shown.splitlines() if " " in line)
    if config.get("proxyjump", "none") != "none" or config.get("proxycommand", "none") != "none":
        return None
    name, port = config.get("hostname", host), int(config.get("port") or spec.ssh_port or 22)
    name = host if name.lower() == host.lower() else name      # ssh -G writes names in lower case
    try:
        with socket.create_connection((name, port), timeout=spec.start_timeout):
            return None
    except socket.timeout:
        return (f"{host}: nothing answered on its ssh port ({name}:{port}) within --start-timeout "
                f"{spec.start_timeout} s; is it up, and is that its name in -H/--hostfile?")
    except ConnectionRefusedError:
        return (f"{host}: its ssh port ({name}:{port}) refused the connection; start sshd there, or give its "
                "port with --ssh-port")
    except OSError as e:
        return f"{host}: its ssh port ({name}:{port}): {e.strerror or e}; is it up, and is that its name in -H/--hostfile?"


def _is_local(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", socket.gethostname())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def plan_workers(spec: LaunchSpec, environ: Mapping[str, str] | None = None,
                 port=_free_port) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, env) per TensorFlow worker: hosts filled slot by slot, as horovodrun fills them."""
    base = worker_env(spec, environ)
    places = [(host, s) for host, slots in parse_hosts(spec.hosts or f"localhost:{spec.np}")
              for s in range(slots)][:spec.np]
    workers = [f"{host}:{port() if _is_local(host) else TF_CONFIG_BASE_PORT + s}" for host, s in places]
    out = []
    for index, (host, _) in enumerate(places):
        env = dict(base, TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                               "task": {"type": "worker", "index": index}}))
        argv = list(spec.extra) + list(spec.command)
        if not _is_local(host):   # the same environment on the other host, through ssh
            # PATH: this virtualenv's bin/ first, then the remote host's own PATH (expanded there),
            # so a bare `python` is the venv's, as on this host.
            names = [k for k in _passed_names(env) if k != "PATH"] + ["TF_CONFIG"]
            remote_path = f'PATH={shlex.quote(os.path.dirname(sys.executable))}:"$PATH"'
            line = " ".join(["cd", shlex.quote(os.getcwd()), "&&", "env", remote_path] +
                            [f"{k}={shlex.quote(env[k])}" for k in sorted(set(names))] +
                            [shlex.quote(a) for a in argv])
            argv = ["ssh", "-o", "BatchMode=yes", *spec.ssh_options(), host, line]
        out.append((argv, env))
    return out


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


def run(spec: LaunchSpec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the launcher; return the job's exit code. A job over `timeout` seconds is killed (124)."""
    if spec.launcher == "tf_config":
        check_hosts(spec)
        return _run_workers(plan_workers(spec, environ), timeout)
    check_hosts(spec)
    argv, env = command_line(spec, environ)
    if argv[0] != sys.executable and shutil.which(argv[0], path=env.get("PATH")) is None:
        fix = "run `make setup`" if argv[0] == "horovodrun" else "install Open MPI (apt-get install openmpi-bin)"
        raise ToolkitError(f"launch: {argv[0]} not found on PATH; {fix}")
    from toolkit.launch.output import Relay

    relay = Relay()
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    pumps = [relay.pump(proc.stdout, sys.stdout), relay.pump(proc.stderr, sys.stderr)]
    forward_sigterm(proc)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise _timed_out(timeout) from None
    except KeyboardInterrupt:
        _kill_group(proc)
        return 130
    for pump in pumps:
        pump.join(timeout=10)
    return relay.finish(code)


def _timed_out(timeout: float) -> ToolkitError:
    return ToolkitError(f"launch: the job ran past --timeout {timeout:g}s and was stopped; "
                        "raise --timeout if it needs longer", code=124)


def _run_workers(workers, timeout: Optional[float]) -> int:
    """Start every worker; the first non-zero exit stops the rest and is the job's exit code."""
    from toolkit.launch.output import Relay

    relay = Relay()
    procs = [subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, errors="replace", bufsize=1) for argv, env in workers]
    forward_sigterm(*procs)
    pumps = [relay.pump(pipe, stream, rank) for rank, p in enumerate(procs)
             for pipe, stream in ((p.stdout, sys.stdout), (p.stderr, sys.stderr))]
    deadline = None if timeout is None else time.monotonic() + timeout
    failed = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = next(((rank, c) for rank, c in enumerate(codes) if c not in (None, 0)), None)
            if failed or all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                raise _timed_out(timeout)
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 130
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
        for pump in pumps:          # the workers are gone: their last lines are in the pipes
            pump.join(timeout=5)
    return relay.worker_failed(*failed) if failed else 0


RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "TF_CONFIG")


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
    previous = []

    def handler(signum, frame):
        if previous:
            for proc in procs:
                _kill_group(proc)
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


def _kill_group(proc: subprocess.Popen) -> None:
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
