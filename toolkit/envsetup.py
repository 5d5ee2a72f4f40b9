"""`toolkit setup`: the whole environment in one idempotent command.

System packages (Open MPI) -> `.venv/` -> pinned packages -> numpy shim for MXNet -> Horovod
(built once, then from the cache) -> every Horovod extension imported to prove it.
Runs under the bare system Python (stdlib only) before the virtualenv exists.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from toolkit import pins
from toolkit.errors import ToolkitError

ROOT = Path(__file__).resolve().parent.parent
SHIM = Path(__file__).resolve().parent / "shims" / "toolkit_numpy_compat.py"
STAMP = ".toolkit-pins"


def pins_digest(gpu: bool = False) -> str:
    """Changes whenever a pin, the CPU/GPU variant, or the way the shim works, changes."""
    text = "\n".join(pins.requirements(gpu) + pins.no_deps_requirements()) + SHIM.read_text()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_system_packages(say, compilers: bool = True) -> None:
    """Open MPI: mpirun, and mpicxx too unless Horovod comes built (`compilers` False: a wheelhouse)."""
    if shutil.which("mpirun") and (shutil.which("mpicxx") or not compilers):
        return
    packages = " ".join(pins.APT_PACKAGES)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ToolkitError(f"Open MPI is missing: install it with `sudo apt-get install -y {packages}`, "
                           "then run `make setup` again")
    say(f"setup: apt-get install {packages}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *pins.APT_PACKAGES]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolkitError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip().splitlines()[-1:]}")


def install_numpy_shim(site_packages: Path) -> None:
    """MXNet 1.9.1 uses `numpy.bool`, gone in numpy 1.24..1.26; a .pth restores it in every process."""
    shutil.copyfile(SHIM, site_packages / SHIM.name)
    (site_packages / "toolkit_numpy_compat.pth").write_text("import toolkit_numpy_compat\n")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(cmd, what: str) -> None:
    proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        raise ToolkitError(f"setup: {what} failed (exit {proc.returncode}):\n{tail}")


def setup(venv: Path, build_args: list[str], say=print, gpu: bool = False) -> None:
    """`gpu`: the GPU image's variant: pins.GPU_REPLACES, and `build-horovod --gpu` (NCCL)."""
    start = time.monotonic()
    if f"{sys.version_info.major}.{sys.version_info.minor}" != pins.PYTHON:
        raise ToolkitError(f"setup needs Python {pins.PYTHON} (this is {sys.version.split()[0]}); "
                           f"run it as `python{pins.PYTHON} -m toolkit setup`")
    ensure_system_packages(say, compilers="--wheelhouse" not in build_args)
    python = _venv_python(venv)
    if not python.exists():
        say(f"setup: creating {venv}")
        _run([sys.executable, "-m", "venv", venv], "creating the virtualenv")
    stamp = venv / STAMP
    if not stamp.exists() or stamp.read_text().strip() != pins_digest(gpu):
        say("setup: installing pinned packages " + ("(GPU: torch, tensorflow, mxnet CPU, numpy<2, ...)" if gpu
                                                    else "(torch + torchvision, tensorflow-cpu, mxnet, numpy<2, ...)"))
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(pip + ["--upgrade", f"setuptools=={pins.TOOLS['setuptools']}",
                    f"wheel=={pins.TOOLS['wheel']}"], "installing setuptools")
        _run(pip + pins.requirements(gpu), "pip install of the pinned packages")
        _run(pip + ["--no-deps"] + pins.no_deps_requirements(), "pip install of tf-keras")
        _run(pip + ["--no-deps", "--no-build-isolation", "-e", ROOT], "installing the toolkit")
        site = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       text=True).strip()
        install_numpy_shim(Path(site))
        stamp.write_text(pins_digest(gpu) + "\n")
    else:
        say("setup: pinned packages already installed")
    if gpu and "--gpu" not in build_args:
        build_args = ["--gpu", *build_args]
    proc = subprocess.run([python, "-m", "toolkit", "build-horovod", *build_args])
    if proc.returncode != 0:
        raise ToolkitError("setup: `toolkit build-horovod` failed (see above)")
    say(f"setup: ready in {time.monotonic() - start:.0f} s; activate with `source {venv}/bin/activate`")
