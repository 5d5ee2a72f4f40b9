"""`toolkit launch --launcher ray`: the job's Ray driver (launchers/ray.py starts it) and `toolkit.ray.run`.

Connects to the Ray cluster at --address (`auto`: the one `ray start` made on this node), or starts a
local Ray for the job and stops it after, as `ray.init()` does (its CPUs: this machine's, or -np x
--cpus-per-worker if more, so -np 4 runs on a 2-core laptop as it does under horovodrun). Then:

- the horovod backend: Horovod's own `RayExecutor` (one actor per worker, Gloo rendezvous at this
  driver; toolkit/shims/horovod_ray.py mends it for today's Ray), each actor running the command
  (engines.run_command) with its HOROVOD_* variables;
- elastic (--min-np/--max-np): Horovod's elastic Ray executor (RayExecutor with min/max workers): Ray's
  nodes are the hosts, a worker that dies is replaced when Ray has room for it, training resets and
  goes on sample-exact (the toolkit's Horovod elastic);
- --backend native (torch): Ray Train's `TorchTrainer`; each worker learns a fresh rendezvous port from
  rank 0 over Ray Train's own process group, closes that group and runs the command with torch's
  RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, as torchrun's ranks have them.

A worker whose command exits non-zero stops the job with its code; a worker that dies (its actor or
node lost) ends a job that is not elastic with one line and exit 1.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Optional

from toolkit.errors import ToolkitError
from toolkit.launch import engines
from toolkit.launch.hosts import free_port
from toolkit.launch.spec import LaunchSpec

EXIT = engines.EXIT



def connect(address: Optional[str], np: int = 1, cpus_per_worker: float = 1) -> None:
    """ray.init: the cluster at `address`, else a local Ray for this job. No cluster there: one line."""
    import ray

    if ray.is_initialized():
        return
    quiet: dict = dict(logging_level=logging.ERROR, log_to_driver=True)
    # Ray Train's progress notes (its State API wants the dashboard, which a job's local Ray goes without)
    logging.getLogger("ray.train").setLevel(logging.ERROR)
    if address is None:
        cpus = max(os.cpu_count() or 1, int(np * cpus_per_worker + 0.999))
        ray.init(num_cpus=cpus, include_dashboard=False, **quiet)
        return
    _reachable(address)
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ToolkitError(f"--address {address}: no Ray cluster answers there ({said}); start one with "
                           "`ray start --head` (it prints the address), or drop --address for a local Ray") from None


def _reachable(address: str) -> None:
    """ray.init retries an address where nothing listens for ever (a warning every 5 s): look first."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ToolkitError(f"--address {address}: expected HOST:PORT (the head's GCS, 6379 unless `ray start` "
                           "was given another --port) or auto")
    if said := engines.unanswered(host, int(port)):
        raise ToolkitError(f"--address {address}: no Ray cluster answers there ({said}); start one "
                           "with `ray start --head` (it prints the address), or drop --address for a local Ray")


def _cluster_check(np: int, cpus: float, gpus: float) -> None:
    """Refuse at once, in one line, a job the cluster can never place (instead of waiting on a placement group)."""
    import ray

    total = ray.cluster_resources()
    for name, each in (("CPU", cpus), ("GPU", gpus)):
        if each and total.get(name, 0) < np * each:
            flag = "--cpus-per-worker" if name == "CPU" else "--gpus-per-worker"
            raise ToolkitError(f"-np {np} x {flag} {each:g} needs {np * each:g} {name}s; the Ray cluster has "
                               f"{total.get(name, 0):g}: lower -np or {flag}, or add nodes")


def _command_in_worker(command, env, cwd) -> int:
    """In a Horovod Ray worker: the command, tagged with the worker's Horovod rank."""
    return engines.run_command(command, env, cwd, int(os.environ.get("HOROVOD_RANK", "0")))


def _elastic_command_in_worker(command, env, cwd) -> int:
    """In an elastic worker: a command that failed raises, so Horovod's elastic driver counts the slot as
    failed (and replaces it) instead of finished."""
    code = _command_in_worker(command, env, cwd)
    if code:
        raise RuntimeError(engines.FAILED.format(rank=os.environ.get("HOROVOD_RANK", "?"), code=code))
    return code


def _wait(refs: list, names: list[str], stop: Callable[[], None], elastic: bool = False) -> int:
    """Wait for every worker; the first non-zero code or lost worker stops the others."""
    import ray

    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            try:
                code = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                why = "its node was lost" if "node" in str(exc).lower() and "died" in str(exc).lower() else \
                    "its process was killed or died"
                raise ToolkitError(f"launch: Ray worker {names[index[ref]]} is gone ({why}); the job stopped (add "
                                   "--min-np N for an elastic job that goes on without it)", code=1) from None
            except ray.exceptions.RayTaskError as exc:
                raise ToolkitError(f"launch: Ray worker {names[index[ref]]} failed: "
                                   f"{str(exc.cause if hasattr(exc, 'cause') else exc).strip().splitlines()[-1]}",
                                   code=1) from None
            codes = code if isinstance(code, list) else [code]
            bad = next((c for c in codes if c), 0)
            if bad:
                print(EXIT.format(rank=names[index[ref]], code=bad), file=sys.stderr, flush=True)
                return bad
        return 0
    finally:
        stop()


def _static(spec: LaunchSpec, env: dict, cwd: str) -> int:
    import ray

    from toolkit.shims import horovod_ray
    horovod_ray.apply()
    from horovod.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=spec.start_timeout, placement_group_timeout_s=spec.start_timeout,
                                           nics={spec.network_interface} if spec.network_interface else None)
    executor = RayExecutor(settings, num_workers=spec.np, cpus_per_worker=spec.cpus_per_worker,
                           use_gpu=spec.gpus_per_worker > 0, gpus_per_worker=spec.gpus_per_worker or None)
    executor.start()
    refs = executor.run_remote(_command_in_worker, args=[list(spec.command), env, cwd])

    def stop():
        for worker in executor.adapter.workers:
            ray.kill(worker, no_restart=True)
    return _wait(refs, [str(r) for r in range(spec.np)], stop)


class _WorkerFailed(logging.Filter):
    """Horovod's elastic driver logs a failed worker's whole traceback; say it in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if m := engines.FAILED_NOTE.search(record.getMessage()):
            print(f"toolkit: launch: worker {m.group(1)} exited with code {m.group(2)}; the elastic job goes on "
                  "without it and Ray starts a new one when it has room", file=sys.stderr, flush=True)
            return False
        return True


def _elastic(spec: LaunchSpec, env: dict, cwd: str) -> int:
    from toolkit.shims import horovod_ray
    horovod_ray.apply()
    logging.getLogger("horovod.ray.elastic_v2").addFilter(_WorkerFailed())
    from horovod.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=spec.start_timeout, placement_group_timeout_s=spec.start_timeout,
                                           nics=horovod_ray.elastic_nics(spec.network_interface))
    executor = RayExecutor(settings, min_workers=spec.min_np or spec.np, max_workers=spec.max_np or spec.np,
                           cpus_per_worker=spec.cpus_per_worker, use_gpu=spec.gpus_per_worker > 0,
                           gpus_per_worker=spec.gpus_per_worker or None, reset_limit=horovod_ray.RESET_LIMIT,
                           cooldown_range=horovod_ray.COOLDOWN, elastic_timeout=spec.start_timeout * 5)
    executor.start()
    env = dict(env, TOOLKIT_ELASTIC_MIN_NP=str(spec.min_np or spec.np))
    try:
        codes = executor.run(_elastic_command_in_worker, args=[list(spec.command), env, cwd])
    except Exception as exc:        # Horovod's elastic driver: the job failed for good
        said = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ToolkitError(f"launch: the elastic Ray job failed: {said}", code=1) from None
    finally:
        executor.shutdown()
    bad = next((c for c in codes if c), 0)
    if bad:
        print(EXIT.format(rank=codes.index(bad), code=bad), file=sys.stderr, flush=True)
    return bad


def _native_in_worker(config: dict) -> None:
    """In a Ray Train worker: the command as a torchrun rank (RANK, WORLD_SIZE, ..., a new MASTER_PORT)."""
    import ray
    import ray.train
    import torch.distributed as dist

    ctx = ray.train.get_context()
    where: list = [(ray.util.get_node_ip_address(), free_port(""))] if ctx.get_world_rank() == 0 else [None]
    dist.broadcast_object_list(where, src=0)     # Ray Train's own group, then closed: the command makes its own
    dist.destroy_process_group()
    addr, port = where[0]
    rank = ctx.get_world_rank()
    env = dict(config["env"], RANK=str(rank), WORLD_SIZE=str(ctx.get_world_size()),
               LOCAL_RANK=str(ctx.get_local_rank()), LOCAL_WORLD_SIZE=str(ctx.get_local_world_size()),
               GROUP_RANK=str(ctx.get_node_rank()), MASTER_ADDR=addr, MASTER_PORT=str(port))
    code = engines.run_command(config["command"], env, config["cwd"], rank)
    if code:
        raise RuntimeError(engines.FAILED.format(rank=rank, code=code))


def _native(spec: LaunchSpec, env: dict, cwd: str) -> int:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = {"CPU": spec.cpus_per_worker, **({"GPU": spec.gpus_per_worker} if spec.gpus_per_worker else {})}
    trainer = TorchTrainer(
        _native_in_worker, train_loop_config={"command": list(spec.command), "env": env, "cwd": cwd},
        torch_config=TorchConfig(backend="nccl" if spec.gpus_per_worker else "gloo"),
        scaling_config=ScalingConfig(num_workers=spec.np, use_gpu=spec.gpus_per_worker > 0,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=f"toolkit-{os.getpid()}-{int(time.time())}",
                             failure_config=FailureConfig(max_failures=0)))
    try:
        trainer.fit()
    except Exception as exc:
        if m := engines.FAILED_NOTE.search(str(exc)):
            print(EXIT.format(rank=m.group(1), code=m.group(2)), file=sys.stderr, flush=True)
            return int(m.group(2))
        said = [t for t in str(exc).strip().splitlines() if t.strip()]
        raise ToolkitError(f"launch: Ray Train's TorchTrainer failed: {said[-1] if said else type(exc).__name__}",
                           code=1) from None
    return 0


def job(spec: LaunchSpec) -> int:
    """The driver's whole job for `spec`; the job's exit code."""
    import ray

    connect(spec.address, spec.np, spec.cpus_per_worker)
    try:
        _cluster_check(spec.min_np or spec.np, spec.cpus_per_worker, spec.gpus_per_worker)
        env, cwd = engines.passed_env(spec), os.getcwd()
        if spec.backend == "native":
            return _native(spec, env, cwd)
        return (_elastic if spec.elastic else _static)(spec, env, cwd)
    finally:
        ray.shutdown()


def run(fn: Callable[[Any], Any], config: Any = None, *, np: int = 2, address: Optional[str] = None,
        cpus_per_worker: float = 1, gpus_per_worker: float = 0, start_timeout: int = 60) -> list:
    """`toolkit.ray.run`: `fn(config)` on `np` Horovod workers of the Ray cluster at `address` (None: the one
    this process is connected to, else a local Ray for the call); returns each worker's result, by rank."""
    import ray

    from toolkit.shims import horovod_ray
    horovod_ray.apply()
    from horovod.ray import RayExecutor

    spec = LaunchSpec(command=("<function>",), np=np, launcher="ray", address=address, start_timeout=start_timeout,
                      cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker)
    started = not ray.is_initialized()
    connect(spec.address, np, cpus_per_worker)
    try:
        _cluster_check(np, cpus_per_worker, gpus_per_worker)
        settings = RayExecutor.create_settings(timeout_s=start_timeout, placement_group_timeout_s=start_timeout)
        executor = RayExecutor(settings, num_workers=np, cpus_per_worker=cpus_per_worker,
                               use_gpu=gpus_per_worker > 0, gpus_per_worker=gpus_per_worker or None)
        executor.start()
        try:
            return executor.run(fn, args=[config])
        finally:
            for worker in executor.adapter.workers:
                ray.kill(worker, no_restart=True)
    finally:
        if started:
            ray.shutdown()


if __name__ == "__main__":     # by its own name, so Ray pickles the workers' functions by reference
    from toolkit.launch import rayjob
    engines.driver_main(rayjob.job)
