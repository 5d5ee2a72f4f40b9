"""Build Horovod 0.28.1 from its sdist against today's frameworks, and cache the wheel.

The stock build fails on torch >= 2.1 (Horovod's CMake forces C++14) and on TensorFlow >= 2.19
(moved XLA headers, headers outside TF's include root). The workarounds live here, once, and
`toolkit setup` and the Docker images both come through `toolkit build-horovod`.

The build runs in the *current* Python environment (it must see the frameworks:
`--no-build-isolation`). Stdlib only, so it is importable before anything is installed.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from toolkit import pins
from toolkit.errors import ToolkitError

ALL_FRAMEWORKS = tuple(pins.HOROVOD_FRAMEWORKS)
_HOROVOD_FLAG = {"torch": "PYTORCH", "tensorflow": "TENSORFLOW", "mxnet": "MXNET"}
# Horovod's CMake forces -std=c++14; torch >= 2.1 headers need C++17 and torch >= 2.14's C++20
# ("#error C++20 or later compatible compiler is required to use PyTorch"), and CXXFLAGS come first
# on the command line, so a launcher appends the flag last, where it wins: C++20 for the compiles
# that see torch's headers (its extension), C++17 for the rest (TensorFlow's and MXNet's headers).
_CXX_LAUNCHER = """#!/bin/sh
case "$*" in
  *site-packages/torch/include*) exec "$@" -std=c++20 ;;
esac
exec "$@" -std=c++17
"""
# TF >= 2.19 moved xla_builder.h; Horovod still includes the old path.
_XLA_SHIM = '#include "xla/hlo/builder/xla_builder.h"\n'
# A CPU build against PyPI's torch (a CUDA build): Horovod's FindPytorch.cmake turns on CUDA when
# `torch.version.cuda` is set and torch finds a CUDA_HOME (here /usr/local/cuda, or any nvcc on PATH),
# then fails on `find_package(CUDAToolkit)` (no CUDA runtime headers). CPU operations need none of
# it: during the build, torch's cpp_extension reports no CUDA_HOME (this sitecustomize, on the
# build's PYTHONPATH only, patches the module when it is first imported).
_TORCH_CPU_SITECUSTOMIZE = """import sys


class _NoCudaHome:
    def find_spec(self, name, path=None, target=None):
        if name != "torch.utils.cpp_extension":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.CUDA_HOME = None

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoCudaHome())
"""
MARKER = ".toolkit_build_key"


@dataclass(frozen=True)
class BuildSpec:
    frameworks: tuple[str, ...] = ALL_FRAMEWORKS
    gpu: bool = False          # HOROVOD_GPU_OPERATIONS=NCCL
    mpi: bool = True           # HOROVOD_WITH_MPI
    gloo: bool = True          # HOROVOD_WITH_GLOO
    extra_env: tuple[str, ...] = ()   # KEY=VALUE passed to the build as they are

    def __post_init__(self):
        unknown = sorted(set(self.frameworks) - set(ALL_FRAMEWORKS))
        if unknown:
            raise ToolkitError(f"--frameworks: unknown {', '.join(unknown)}; "
                               f"choose from {', '.join(ALL_FRAMEWORKS)}")
        if not self.frameworks:
            raise ToolkitError("--frameworks: name at least one of " + ", ".join(ALL_FRAMEWORKS))
        if not (self.mpi or self.gloo):
            raise ToolkitError("build-horovod: --no-mpi and --no-gloo together leave no controller; keep one")
        for item in self.extra_env:
            if "=" not in item:
                raise ToolkitError(f"--env {item!r}: expected KEY=VALUE, e.g. --env HOROVOD_DEBUG=1")


def framework_versions(frameworks) -> dict[str, str]:
    """Installed distribution versions, read from metadata (no framework import)."""
    found = {}
    for fw in frameworks:
        candidates = {"tensorflow": ("tensorflow-cpu", "tensorflow")}.get(fw, (pins.HOROVOD_FRAMEWORKS[fw][0],))
        for dist in candidates:
            try:
                found[fw] = f"{dist}=={metadata.version(dist)}"
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            raise ToolkitError(f"build-horovod: {fw} is not installed in {sys.prefix}; run `make setup` "
                               f"or drop it with --frameworks")
    return found


def cache_key(spec: BuildSpec, versions: dict[str, str]) -> str:
    """Readable and unique: Horovod, Python, every framework version, the operations, extra flags."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    fws = "-".join(versions[f].replace("==", "") for f in sorted(versions))
    ops = "nccl" if spec.gpu else "cpu"
    ctl = "+".join(c for c, on in (("mpi", spec.mpi), ("gloo", spec.gloo)) if on)
    extra = hashlib.sha256("\n".join(spec.extra_env).encode()).hexdigest()[:8] if spec.extra_env else ""
    return "_".join(p for p in (f"horovod{pins.HOROVOD}", py, fws, ops, ctl, extra) if p)


def cache_dir() -> Path:
    root = os.environ.get("TOOLKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "toolkit")
    return Path(root) / "horovod"


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def build_env(spec: BuildSpec, workdir: Path, base_env: dict[str, str]) -> dict[str, str]:
    """The environment for `pip wheel horovod`: framework switches and the workarounds."""
    env = dict(base_env)
    switches = {**{_HOROVOD_FLAG[fw]: fw in spec.frameworks for fw in ALL_FRAMEWORKS},
                "MPI": spec.mpi, "GLOO": spec.gloo}
    for name, on in switches.items():
        env.pop(f"HOROVOD_WITH_{name}", None)
        env.pop(f"HOROVOD_WITHOUT_{name}", None)
        env[f"HOROVOD_WITH{'' if on else 'OUT'}_{name}"] = "1"
    if spec.gpu:
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 2}")

    launcher = workdir / "cxx_std"
    launcher.write_text(_CXX_LAUNCHER)
    launcher.chmod(0o755)
    env["CMAKE_CXX_COMPILER_LAUNCHER"] = str(launcher)

    if "torch" in spec.frameworks and not spec.gpu:
        site = workdir / "torch_cpu"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(_TORCH_CPU_SITECUSTOMIZE)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(site), env.get("PYTHONPATH"))))

    cxxflags = [env.get("CXXFLAGS", "")]
    if "tensorflow" in spec.frameworks:
        tf_include = _site_packages() / "tensorflow" / "include"
        shim = workdir / "xla_shim"
        header = shim / "tensorflow" / "compiler" / "xla" / "client" / "xla_builder.h"
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text(_XLA_SHIM)
        cxxflags += [f"-I{tf_include}/external/highwayhash",
                     f"-I{tf_include}/external/farmhash_archive/src", f"-I{shim}"]
    env["CXXFLAGS"] = " ".join(f for f in cxxflags if f)
    for item in spec.extra_env:
        key, value = item.split("=", 1)
        env[key] = value
    return env


def extension_status(frameworks=ALL_FRAMEWORKS, python: str = sys.executable) -> dict[str, str | None]:
    """Import each Horovod extension in a fresh process: None when it loads, else the reason.

    `horovodrun --check-build` ticks frameworks that were not built, so the extension itself is
    imported. Each in its own process, so one broken framework cannot hide another.
    """
    status = {}
    for fw in frameworks:
        module = pins.HOROVOD_FRAMEWORKS[fw][2]
        proc = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True,
                              timeout=300)
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        status[fw] = None if proc.returncode == 0 else (lines[-1] if lines else f"exit {proc.returncode}")
    return status


def installed_key() -> str | None:
    """The cache key of the Horovod build installed here, if the toolkit installed it."""
    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    marker = Path(list(spec.submodule_search_locations)[0]) / MARKER
    return marker.read_text().strip() if marker.exists() else None


def _pip(*args: str, env=None, log=None) -> None:
    """Run pip in this environment; output to `log` if given, else kept for the error message."""
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)
    if proc.returncode != 0:
        tail = "" if log else "\n" + "\n".join((proc.stdout or "").splitlines()[-20:])
        raise ToolkitError(f"`pip {' '.join(args[:3])} ...` failed (exit {proc.returncode}){tail}")


def _install(wheel: Path, key: str) -> None:
    _pip("install", "--no-deps", "--force-reinstall", "--no-compile", str(wheel))
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("horovod")
    (Path(list(spec.submodule_search_locations)[0]) / MARKER).write_text(key + "\n")


def build_and_install(spec: BuildSpec, force: bool = False, sdist: str | None = None,
                      say=print) -> Path:
    """Install Horovod for `spec`: from the cache when it holds this key, else build, verify, cache."""
    if not shutil.which("cmake"):
        raise ToolkitError("build-horovod: cmake not found; install it (apt-get install cmake)")
    if spec.mpi and not shutil.which("mpicxx"):
        raise ToolkitError("build-horovod: mpicxx not found; install Open MPI "
                           f"(apt-get install {' '.join(pins.APT_PACKAGES)}) or pass --no-mpi")
    versions = framework_versions(spec.frameworks)
    key = cache_key(spec, versions)
    folder = cache_dir() / key
    cached = sorted(folder.glob("horovod-*.whl"))
    if not force and installed_key() == key:
        say(f"horovod: already installed, the build cached in {cached[0] if cached else folder}")
        return cached[0] if cached else folder
    if cached and not force:
        say(f"horovod: installing cached wheel {cached[0]}")
        _install(cached[0], key)
        return cached[0]

    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "build.log"
    say(f"horovod: building {pins.HOROVOD} for {', '.join(spec.frameworks)} "
        f"({'NCCL' if spec.gpu else 'CPU'} ops); log: {log_path} (about 10-20 min on 2 cores)")
    with tempfile.TemporaryDirectory(prefix="toolkit-hvd-") as tmp:
        work = Path(tmp)
        env = build_env(spec, work, dict(os.environ))
        target = sdist or f"horovod=={pins.HOROVOD}"
        with open(log_path, "w") as log:
            try:
                # --no-cache-dir: pip's own wheel cache is keyed by the sdist alone and would hand back
                # a wheel built against other framework versions (seen when torch's pin moved)
                _pip("wheel", "--no-build-isolation", "--no-deps", "--no-binary", "horovod", "--no-cache-dir", "-v",
                     "-w", str(work / "dist"), target, env=env, log=log)
            except ToolkitError as e:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
                raise ToolkitError(f"{e}; last lines of {log_path}:\n{tail}") from None
        wheel = next((work / "dist").glob("horovod-*.whl"))
        _install(wheel, key)
        bad = {fw: why for fw, why in extension_status(spec.frameworks).items() if why}
        if bad:
            raise ToolkitError("build-horovod: built, but these extensions do not import: "
                               + "; ".join(f"{fw}: {why}" for fw, why in bad.items())
                               + f". See {log_path}")
        final = folder / wheel.name
        partial = folder / (wheel.name + ".partial")
        shutil.copyfile(wheel, partial)
        os.replace(partial, final)
    say(f"horovod: built and cached {final}")
    return final

