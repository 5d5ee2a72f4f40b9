"""`toolkit launch --emit slurm|mpijob`: the same launch as a cluster recipe, printed, not run.

- slurm: an sbatch script; `srun` starts one task per slot (Horovod finds its MPI rank through
  PMIx), with the job's environment exported, and the whole step stops when one rank fails. With
  the torchrun launcher (--backend native, torch): one task per node, each a torchrun starting the
  node's ranks, meeting at a c10d rendezvous on the job's first node (port 29400); no preemption
  requeue there (torchrun exits 1 whatever its ranks' code: a preemption's 75 cannot be told apart).
- mpijob: a Kubeflow MPI Operator (v2beta1) manifest: one launcher pod running `mpirun` and one
  worker pod per node, all from `--image`; one GPU per slot with `--gpus`. Not for torchrun.

Nodes and slots per node come from -H / --hostfile (every host must have the same slots) or, without
them, one node with -np slots. Pure functions of the LaunchSpec: unit-tested, no cluster needed.
"""
from __future__ import annotations

import math
import shlex
from typing import Any, Optional

from toolkit.errors import ToolkitError
from toolkit.launch.hosts import parse_hosts
from toolkit.launch.launchers.torchrun import TORCHRUN_PORT, torchrun_size
from toolkit.launch.spec import LaunchSpec
from toolkit.run.preemption import EXIT_CODE

EMITS = ("slurm", "mpijob")


def nodes_and_slots(spec: LaunchSpec) -> tuple[int, int]:
    if not spec.hosts:
        return 1, spec.np
    slots = {n for _, n in parse_hosts(spec.hosts)}
    if len(slots) != 1:
        raise ToolkitError(f"--emit: hosts {spec.hosts} have different slot counts; a cluster recipe asks for "
                           "the same slots on every node: give every host the same slots")
    per_node = slots.pop()
    return math.ceil(spec.np / per_node), per_node


def _time(seconds: Optional[float]) -> str:
    seconds = int(seconds or 3600)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def slurm(spec: LaunchSpec, timeout: Optional[float] = None, gpus: bool = False, name: str = "toolkit") -> str:
    if spec.launcher == "torchrun":
        return _slurm_torchrun(spec, timeout, gpus, name)
    nodes, per_node = nodes_and_slots(spec)
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={name}",
             f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks={spec.np}",
             f"#SBATCH --ntasks-per-node={per_node}",
             f"#SBATCH --time={_time(timeout)}"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={per_node}")
    lines += ["# Made by `toolkit launch --emit slurm`. One task per slot; each rank pins the GPU of its",
              "# local rank. Without PMIx in your Slurm, replace the srun line with:",
              f"#   mpirun -np {spec.np} -bind-to none -map-by slot -x PATH -x LD_LIBRARY_PATH "
              + " ".join(shlex.quote(a) for a in spec.command),
              "set -euo pipefail"]
    lines += _exports(spec, "HOROVOD_GLOO_IFACE")
    srun = "srun --mpi=pmix --kill-on-bad-exit=1 --cpu-bind=none " + " ".join(shlex.quote(a) for a in spec.command)
    folder = _checkpoint_dir(spec)
    if folder is None:
        lines.append(srun)
        return "\n".join(lines) + "\n"
    # Preemption (toolkit/run/preemption.py): SIGTERM to every task GRACE s before the time limit; the ranks
    # finish their step, rank 0 checkpoints, they exit 75; the job is requeued and resumes.
    lines[6:6] = [f"#SBATCH --signal=TERM@{GRACE_SECONDS}", "#SBATCH --requeue"]
    lines += ["# A run after a preemption (exit 75, requeued) resumes from the newest checkpoint.",
              f"resume=(); compgen -G {shlex.quote(folder)}'/ckpt-*' >/dev/null && resume=(--resume)",
              f"rc=0; {srun} \"${{resume[@]}}\" || rc=$?",
              f'if [ "$rc" -eq {EXIT_CODE} ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
              'exit "$rc"']
    return "\n".join(lines) + "\n"


def _exports(spec: LaunchSpec, gloo_interface: str) -> list[str]:
    """The job script's `export` lines: --env items, unbuffered output, the NIC for Gloo (`gloo_interface`:
    Horovod's or torch's variable) and NCCL."""
    lines = [f"export {shlex.quote(item.split('=', 1)[0])}={shlex.quote(item.split('=', 1)[1])}" for item in spec.env]
    lines.append("export PYTHONUNBUFFERED=1")
    if spec.network_interface:
        lines.append(f"export {gloo_interface}={shlex.quote(spec.network_interface)}"
                     f" NCCL_SOCKET_IFNAME={shlex.quote(spec.network_interface)}")
    return lines


GRACE_SECONDS = 120     # SIGTERM this long before the end: enough for a step and a checkpoint


def _slurm_torchrun(spec: LaunchSpec, timeout: Optional[float], gpus: bool, name: str) -> str:
    nodes, per_node = nodes_and_slots(spec)
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={name}",
             f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --time={_time(timeout)}"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={per_node}")
    lines += [f"# Made by `toolkit launch --emit slurm`: one torchrun per node starts its {per_node} rank(s); they",
              f"# meet at the c10d rendezvous on the first node (port {TORCHRUN_PORT}).",
              "set -euo pipefail"]
    lines += _exports(spec, "GLOO_SOCKET_IFNAME")
    lines.append('head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    torchrun = ["torchrun", *torchrun_size(spec, nodes, per_node), "--nproc-per-node", str(per_node),
                "--rdzv-backend", "c10d"]
    lines.append("srun --kill-on-bad-exit=1 --cpu-bind=none " + " ".join(shlex.quote(a) for a in torchrun) +
                 f' --rdzv-endpoint "$head:{TORCHRUN_PORT}" --rdzv-id "$SLURM_JOB_ID" --no-python ' +
                 " ".join(shlex.quote(a) for a in spec.command))
    return "\n".join(lines) + "\n"


def _checkpoint_dir(spec: LaunchSpec) -> Optional[str]:
    """The ranks' checkpoint_dir (a preempted job can only resume with one), by their own precedence as far as
    the recipe shows it: the command's --checkpoint-dir, else a TOOLKIT_CHECKPOINT_DIR given with --env (the
    script exports it), else the `checkpoint_dir` of the YAML file the command passes with --config (the
    README's `--config examples/cfg.yaml`)."""
    from toolkit.config import command_keys

    command, found = list(spec.command), None
    for i, arg in enumerate(command):
        if arg == "--checkpoint-dir" and i + 1 < len(command):
            found = command[i + 1]
        elif arg.startswith("--checkpoint-dir="):
            found = arg.split("=", 1)[1]
    if found is not None:
        return found
    env = dict(item.split("=", 1) for item in spec.env)
    if env.get("TOOLKIT_CHECKPOINT_DIR"):
        return env["TOOLKIT_CHECKPOINT_DIR"]
    folder = command_keys(command).get("checkpoint_dir")
    return str(folder) if folder else None


def mpijob(spec: LaunchSpec, image: Optional[str], timeout: Optional[float] = None, gpus: bool = False,
           name: str = "toolkit") -> dict:
    """The manifest as a dict (the CLI prints it as YAML)."""
    if spec.launcher == "torchrun":
        raise ToolkitError("--emit mpijob writes an MPIJob, which starts mpirun; torchrun's ranks (--backend native) "
                           "run in a Kubeflow PyTorchJob: write one, or use --emit slurm")
    if not image:
        raise ToolkitError("--emit mpijob needs --image IMAGE: the image every pod runs (docker/build.sh makes one)")
    nodes, per_node = nodes_and_slots(spec)
    env = [{"name": k, "value": v} for k, v in (item.split("=", 1) for item in spec.env)]
    env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
    mpirun = ["mpirun", "--allow-run-as-root", "-np", str(spec.np), "-bind-to", "none", "-map-by", "slot"]
    for item in env:
        mpirun += ["-x", item["name"]]
    if spec.network_interface:
        mpirun += ["-mca", "btl_tcp_if_include", spec.network_interface]
    worker: dict[str, Any] = {"name": "worker", "image": image, "env": [dict(e) for e in env]}   # copies: no YAML anchors
    if gpus:
        worker["resources"] = {"limits": {"nvidia.com/gpu": per_node}}
    # Preemption (toolkit/run/preemption.py): a worker pod's SIGTERM reaches only its PID 1 (sshd), so a
    # preStop hook passes it to the ranks and waits while they finish the step and rank 0 checkpoints.
    ranks = shlex.quote(" ".join(spec.command[:2]))
    worker["lifecycle"] = {"preStop": {"exec": {"command": [
        "/bin/sh", "-c", f"pkill -TERM -f {ranks}; while pgrep -f {ranks} >/dev/null; do sleep 1; done"]}}}
    worker_spec = {"terminationGracePeriodSeconds": GRACE_SECONDS, "containers": [worker]}
    run_policy = {"cleanPodPolicy": "Running", "backoffLimit": 0}
    if timeout:
        run_policy["activeDeadlineSeconds"] = int(timeout)
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": per_node,
            "runPolicy": run_policy,
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [
                    {"name": "launcher", "image": image, "env": env, "command": mpirun + list(spec.command)}]}}},
                "Worker": {"replicas": nodes, "template": {"spec": worker_spec}},
            },
        },
    }
