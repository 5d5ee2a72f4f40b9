"""The tf_config launcher (`toolkit launch --backend native` for TensorFlow): the toolkit starts one process
per worker itself (over ssh for other hosts), each with its TF_CONFIG, for MultiWorkerMirroredStrategy; hosts
are filled slot by slot, as horovodrun fills them; the first worker to fail stops the others."""
from __future__ import annotations

import json
from typing import Mapping, Optional

from toolkit.errors import ToolkitError
from toolkit.launch.environment import over_ssh, worker_env
from toolkit.launch.hosts import check_hosts, free_port, is_local, parse_hosts
from toolkit.launch.launchers.base import Command, Launcher
from toolkit.launch.processes import run_workers

TF_CONFIG_BASE_PORT = 23456     # worker s on a remote host listens on base + s (local workers: free ports)


def plan_workers(spec, environ: Mapping[str, str] | None = None, port=free_port) -> list[Command]:
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
            argv = over_ssh(spec, host, argv, env, ["TF_CONFIG"])
        out.append((argv, env))
    return out


class TfConfig(Launcher):
    name = "tf_config"
    backends = ("native",)

    def check(self, spec) -> None:
        if spec.controller is not None:
            raise ToolkitError(f"--{spec.controller} is a Horovod controller; TensorFlow's native workers "
                               "(--backend native) talk through TF_CONFIG: drop it")

    def commands(self, spec, environ: Mapping[str, str] | None = None) -> list[Command]:
        return plan_workers(spec, environ)

    def run(self, spec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
        check_hosts(spec)
        return run_workers(plan_workers(spec, environ), timeout)
