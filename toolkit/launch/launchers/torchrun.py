"""The torchrun launcher (`--backend native` for torch: torch.distributed): one torchrun per host
(`python -m torch.distributed.run` of this Python), over ssh for other hosts as TF workers are.

One host runs `--standalone`; several meet at a c10d rendezvous on the first host (a free port when it is
this machine, else TORCHRUN_PORT; --start-timeout is its join_timeout). torchrun has one --nproc-per-node for
every host, so -np must fill the hosts it uses (in -H order, as horovodrun fills slots) equally. The command
runs as given (`--no-python`); each rank's lines are tagged with its global rank and shown as horovodrun's
(`[1]<stderr>:`, output.py). Elastic (--min-np/--max-np) counts whole hosts: `--nnodes MIN:MAX --max-restarts
3`; torchrun restarts every worker after a failure or a change of hosts, and the restarted ranks run the
command from the top: they continue from the newest checkpoint when their config names a checkpoint_dir
(torchrun's TORCHELASTIC_RESTART_COUNT says they were restarted; nothing else survives a restart).
"""
from __future__ import annotations

import importlib.util
import socket
import sys
import uuid
from typing import Mapping, Optional

from toolkit.errors import ToolkitError
from toolkit.launch.environment import over_ssh, worker_env
from toolkit.launch.hosts import check_hosts, free_port, is_local, parse_hosts
from toolkit.launch.launchers.base import Command, Launcher
from toolkit.launch.processes import run_workers

TORCHRUN_PORT = 29400           # the rendezvous on a first host that is another machine (torchrun's default)
TORCHRUN_MAX_RESTARTS = 3       # elastic: restarts of the worker group before the job fails
# The prefix torchrun writes before each rank's line (its --tee); output.py makes it `[rank]<stdout|stderr>:`.
TORCHRUN_TAG = "[${rank}]<std>:"


def torchrun_nodes(spec) -> list[tuple[str, int]]:
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


def torchrun_size(spec, nodes: int, per_node: int) -> list[str]:
    """--nnodes for `nodes` hosts of `per_node` ranks; elastic: the range of nodes and the restarts."""
    if not spec.elastic:
        return ["--nnodes", str(nodes), *restarts(spec)]
    low = (spec.min_np or spec.np) // per_node
    high = spec.max_np // per_node if spec.max_np else nodes
    return ["--nnodes", f"{low}:{high}", *restarts(spec)]


def restarts(spec) -> list[str]:
    """--max-restarts as given (`toolkit launch --max-restarts`), else TORCHRUN_MAX_RESTARTS when elastic."""
    if spec.max_restarts is None and not spec.elastic:
        return []
    return ["--max-restarts", str(TORCHRUN_MAX_RESTARTS if spec.max_restarts is None else spec.max_restarts)]


def plan_torchrun(spec, environ: Mapping[str, str] | None = None, port=free_port,
                  job_id: Optional[str] = None) -> list[Command]:
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
        argvs = [torchrun + ["--standalone", "--nproc-per-node", str(per), *restarts(spec)] + tail]
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
    return [(argv if is_local(host) else over_ssh(spec, host, argv, env, list(ifname)), env)
            for (host, _), argv in zip(nodes, argvs)]


class Torchrun(Launcher):
    name = "torchrun"
    backends = ("native",)
    elastic = True
    elastic_flags = "--min-np"

    def output_flags(self, verbose: bool, output: str | None) -> list[str]:
        """--output-filename DIR: torchrun's --log-dir (its output also on the terminal, --tee 3);
        --verbose: torchrun has none."""
        if verbose:
            raise ToolkitError("--verbose: torchrun has no such option; LOGLEVEL=INFO (--env LOGLEVEL=INFO) makes "
                               "it say more")
        return ["--log-dir", output] if output else []

    def check(self, spec) -> None:
        if spec.controller is not None:
            raise ToolkitError(f"--{spec.controller} is a Horovod controller; torchrun's ranks (--backend native) "
                               "meet at its own rendezvous: drop it")
        per = torchrun_nodes(spec)[0][1]        # -np fills the hosts it uses equally
        if not spec.elastic:
            return
        if spec.discovery is not None:
            raise ToolkitError("--host-discovery-script is Horovod elastic's; torchrun has none (its nodes join "
                               "at the rendezvous, --min-np/--max-np bound them): drop it")
        for flag, value in (("--min-np", spec.min_np or spec.np), ("--max-np", spec.max_np)):
            if value is not None and value % per:
                raise ToolkitError(f"{flag} {value}: torchrun's elastic unit is a node of {per} rank(s) (-np "
                                   f"{spec.np} on -H {spec.hosts or f'localhost:{spec.np}'}); give a multiple "
                                   f"of {per}")

    def commands(self, spec, environ: Mapping[str, str] | None = None) -> list[Command]:
        return plan_torchrun(spec, environ)

    def run(self, spec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
        check_hosts(spec)
        if any(is_local(host) for host, _ in torchrun_nodes(spec)) and importlib.util.find_spec("torch") is None:
            raise ToolkitError(f"launch: torchrun is torch's; torch is not installed in {sys.executable} "
                               "(pip install torch)")
        return run_workers(plan_torchrun(spec, environ), timeout, tagged=True)
