"""Where this rank is and how to reach rank 0, from whichever launcher started it, for torch.distributed.

`init_process_group` needs every rank's (rank, world size) and one address all ranks reach (a TCP
store on rank 0's host). Each launcher says it its own way:

- torchrun (and `toolkit launch --backend native`): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT: torch's own `env://`;
- horovodrun (Gloo): HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE; rank 0 chooses
  a free port and publishes its address in horovodrun's own rendezvous key-value store
  (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT), which the others read;
- mpirun (and `horovodrun --mpi`): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; rank 0's
  address goes to the others through mpi4py (a broadcast on COMM_WORLD);
- Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE; MASTER_ADDR from the
  environment or the first host of SLURM_JOB_NODELIST, MASTER_PORT from the environment or 29500;
- none of them: one process, world size 1, on a free local port.

MASTER_ADDR and MASTER_PORT, where the user set them, win over the launcher's own ways.
"""
from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass

from toolkit.errors import ToolkitError

DEFAULT_PORT = 29500
KV_SCOPE = "toolkit.torch_native"


@dataclass(frozen=True)
class Place:
    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str               # torchrun, horovodrun, mpirun, slurm, none


def _int(environ, *names) -> int | None:
    for name in names:
        value = environ.get(name, "")
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def place(environ=None) -> Place:
    """This rank's place, from the first launcher whose variables are set."""
    env = os.environ if environ is None else environ
    rows = (("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
            ("horovodrun", ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")),
            ("mpirun", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE")),
            ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")))
    for launcher, names in rows:
        rank, size = _int(env, names[0]), _int(env, names[1])
        if rank is None or size is None:
            continue
        local_rank = _int(env, names[2])
        local_size = _int(env, names[3]) if launcher != "slurm" else _slurm_local_size(env)
        if launcher == "torchrun" and local_size is None:     # plain env:// without torchrun
            local_size = size
        if not 0 <= rank < size:
            raise ToolkitError(f"{names[0]}={rank} is not a rank of {names[1]}={size}; start the ranks "
                               "with torchrun, horovodrun, mpirun or srun")
        return Place(rank, size, local_rank if local_rank is not None else rank,
                     local_size if local_size is not None else size, launcher)
    return Place(0, 1, 0, 1, "none")


def _slurm_local_size(env) -> int | None:
    value = env.get("SLURM_NTASKS_PER_NODE", "")       # "4" or "4(x2)"
    match = re.match(r"(\d+)", value)
    return int(match.group(1)) if match else None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `node[03-05,07],gpu1` -> node03."""
    first = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not first:
        raise ToolkitError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read its first host; set MASTER_ADDR")
    prefix, _, ranges = first.groups()
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def init_method(where: Place, environ=None, timeout: float = 120.0) -> str:
    """The `init_method` URL for torch.distributed.init_process_group on this rank."""
    env = os.environ if environ is None else environ
    if where.size == 1 and "MASTER_ADDR" not in env:
        return f"tcp://127.0.0.1:{_free_port()}"
    if "MASTER_ADDR" in env:
        return f"tcp://{env['MASTER_ADDR']}:{_int(env, 'MASTER_PORT') or DEFAULT_PORT}"
    if where.launcher == "slurm":
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ToolkitError("srun: SLURM_JOB_NODELIST is not set; set MASTER_ADDR to the first node's address")
        return f"tcp://{first_slurm_host(nodelist)}:{_int(env, 'MASTER_PORT') or DEFAULT_PORT}"
    if where.launcher == "horovodrun" and env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return _through_horovodrun(where, env, timeout)
    if where.launcher in ("mpirun", "horovodrun"):
        return _through_mpi(where)
    raise ToolkitError(f"{where.launcher}: no MASTER_ADDR to meet rank 0 at; set MASTER_ADDR and MASTER_PORT "
                       "or launch with torchrun (`toolkit launch --backend native`)")


def _rank0_address(where: Place, towards: str | None) -> str:
    """An address of this host the other ranks reach: loopback when every rank is on this host, else
    the address this host uses towards `towards` (the launcher's host), else its name's."""
    if where.local_size == where.size:
        return "127.0.0.1"
    if towards:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((towards, 9))     # no packet is sent: only the route is looked up
                return s.getsockname()[0]
            except OSError:
                pass
    return socket.gethostbyname(socket.gethostname())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _through_horovodrun(where: Place, env, timeout: float) -> str:
    """Rank 0 puts `host:port` into horovodrun's rendezvous store; the others poll it."""
    from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore
    addr, port = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    key = "master." + env.get("HOROVOD_GLOO_RENDEZVOUS_EPOCH", "0")
    if where.rank == 0:
        value = f"{_rank0_address(where, addr)}:{_free_port()}"
        put_data_into_kvstore(addr, port, KV_SCOPE, key, value)
        return f"tcp://{value}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            return f"tcp://{read_data_from_kvstore(addr, port, KV_SCOPE, key)}"
        except RuntimeError:
            if time.monotonic() > deadline:
                raise ToolkitError(f"rank 0 did not publish its address in horovodrun's store within "
                                   f"{timeout:.0f} s; check that rank 0 started") from None
            time.sleep(0.1)


def _through_mpi(where: Place) -> str:
    try:
        from mpi4py import MPI
    except ImportError:
        raise ToolkitError("under mpirun the native backend meets rank 0 through mpi4py, which is not installed; "
                           "install mpi4py, or set MASTER_ADDR and MASTER_PORT, or launch with torchrun") from None
    value = f"{_rank0_address(where, None)}:{_free_port()}" if where.rank == 0 else None
    return f"tcp://{MPI.COMM_WORLD.bcast(value, root=0)}"
