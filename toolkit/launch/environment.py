"""What every rank starts with, whichever launcher starts it: the caller's environment with --env items and
unbuffered output, the variables passed to ranks on other hosts (or into an engine's workers), a command
run over ssh, and a command as a shell line (`--dry-run`)."""
from __future__ import annotations

import os
import shlex
import sys
from typing import Mapping, Sequence

# Variables every rank needs to see the same Python environment and the toolkit's settings.
# TensorFlow's own by name: a bare `TF_` prefix also caught other tools' (Terraform's TF_CLI_CONFIG_FILE).
PASS_PREFIXES = ("TOOLKIT_", "HOROVOD_", "NCCL_", "OMP_", "MXNET_", "TF_CPP_", "TF_XLA_", "TF_GPU_", "TF_FORCE_",
                 "TF_NUM_", "TF_ENABLE_")
PASS_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "TF_USE_LEGACY_KERAS",
              "TF_DETERMINISTIC_OPS", "TF_CONFIG")


def passed_names(environ: Mapping[str, str]) -> list[str]:
    """The names in `environ` that are passed on to ranks elsewhere (mpirun's -x, ssh, an engine's workers)."""
    return sorted(k for k in environ if k in PASS_NAMES or k.startswith(PASS_PREFIXES))


def worker_env(spec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every rank of `spec` (a LaunchSpec) starts with: the caller's, `--env` items, unbuffered
    output."""
    env = dict(os.environ if environ is None else environ)
    env.update(item.split("=", 1) for item in spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Launched from a virtualenv (`.venv/bin/toolkit launch`), the job uses that environment:
    # its bin/ holds horovodrun and the python the ranks should run, active or not.
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p)
    return env


def over_ssh(spec, host: str, argv: list[str], env: Mapping[str, str], names: Sequence[str]) -> list[str]:
    """`argv` on `host` through ssh, in this directory, with the variables every rank is passed and `names`."""
    # PATH: this virtualenv's bin/ first, then the remote host's own PATH (expanded there),
    # so a bare `python` is the venv's, as on this host.
    names = [k for k in passed_names(env) if k != "PATH"] + list(names)
    remote_path = f'PATH={shlex.quote(os.path.dirname(sys.executable))}:"$PATH"'
    line = " ".join(["cd", shlex.quote(os.getcwd()), "&&", "env", remote_path] +
                    [f"{k}={shlex.quote(env[k])}" for k in sorted(set(names))] +
                    [shlex.quote(a) for a in argv])
    return ["ssh", "-o", "BatchMode=yes", *spec.ssh_options(), host, line]


def format_command(argv: Sequence[str], env: Mapping[str, str], base: Mapping[str, str]) -> str:
    """A shell line a user can paste: changed variables first, then the command."""
    changed = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if base.get(k) != v]
    return " ".join(changed + [shlex.quote(a) for a in argv])
