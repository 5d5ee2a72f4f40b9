"""Build Horovod 0.28.1 from its sdist against today's frameworks, and cache the wheel.

The stock build fails on today's frameworks (torch >= 2.1, TensorFlow >= 2.19) and toolchains (GCC
>= 13, CMake >= 4, NCCL and CUDA's compiler from pip wheels). Every workaround is one row of
WORKAROUNDS, with the error it fixes and when it applies, judged from the detected toolchain
(toolkit/build/toolchain.py); `toolkit build-horovod --explain` prints the table for this machine.
`toolkit setup` and the Docker images both come through `toolkit build-horovod`.

The build runs in the *current* Python environment (it must see the frameworks:
`--no-build-isolation`). Stdlib only, so it is importable before anything is installed.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

from toolkit.build import pins, toolchain as toolchain_mod, wheelhouse
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
BUILD_INFO = ".toolkit_build.json"      # the installed build's manifest (wheelhouse.manifest)


@dataclass(frozen=True)
class BuildSpec:
    frameworks: tuple[str, ...] = ALL_FRAMEWORKS
    gpu: bool = False          # HOROVOD_GPU_OPERATIONS=NCCL
    mpi: bool = True           # HOROVOD_WITH_MPI
    gloo: bool = True          # HOROVOD_WITH_GLOO
    extra_env: tuple[str, ...] = ()   # KEY=VALUE passed to the build as they are
    cuda_arch: str | None = None      # "80,90": compute capabilities (default: the GPUs present, else a list)

    @property
    def operations(self) -> str:
        return "nccl" if self.gpu else "cpu"

    @property
    def controllers(self) -> list[str]:
        return [c for c, on in (("mpi", self.mpi), ("gloo", self.gloo)) if on]

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
        if self.cuda_arch is not None:
            if not self.gpu:
                raise ToolkitError("--cuda-arch applies to GPU builds; add --gpu or drop it")
            if not all(a.isdigit() and len(a) >= 2 for a in self.cuda_arch.split(",")):
                raise ToolkitError(f"--cuda-arch {self.cuda_arch!r}: expected compute capabilities without the dot, "
                                   "e.g. --cuda-arch 80,90 (A100, H100)")


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
    """Readable and unique: Horovod, Python, every framework version, the operations, the workarounds
    that change the built code (in_key), extra flags."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    fws = "-".join(versions[f].replace("==", "") for f in sorted(versions))
    ops = spec.operations
    ctl = "+".join(spec.controllers)
    patched = "+".join(w.name for w in WORKAROUNDS if w.in_key and w.applies(Build(spec, None, Path(), {})))
    extra = hashlib.sha256("\n".join(spec.extra_env).encode()).hexdigest()[:8] if spec.extra_env else ""
    return "_".join(p for p in (f"horovod{pins.HOROVOD}", py, fws, ops, ctl, patched, extra) if p)


def cache_dir() -> Path:
    root = os.environ.get("TOOLKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "toolkit")
    return Path(root) / "horovod"


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


DEFAULT_CUDA_ARCHS = "75,80,86,89,90"     # Turing .. Hopper: nvcc 12 and 13 both compile these (13 dropped sm_70)


@dataclass
class Build:
    """What a workaround sees and changes: the request, the toolchain, a scratch folder, the environment."""
    spec: BuildSpec
    toolchain: toolchain_mod.Toolchain
    workdir: Path
    env: dict[str, str]
    source: Path | None = None                   # the unpacked sdist, for the workarounds that patch it

    def add_cxxflags(self, *flags: str) -> None:
        self.env["CXXFLAGS"] = " ".join(f for f in (self.env.get("CXXFLAGS", ""), *flags) if f)


@dataclass(frozen=True)
class Workaround:
    name: str
    fixes: str                                   # the error the stock build stops with
    applies: Callable[[Build], bool]
    apply: Callable[[Build], None]
    when: str                                    # `applies` in words
    # Changes what the built code does (not only whether it compiles): the cache key names it, so a
    # wheel built without it is never reused. Such a row's `applies` reads b.spec alone.
    in_key: bool = False


def _cxx_launcher(b: Build) -> None:
    launcher = b.workdir / "cxx_std"
    launcher.write_text(_CXX_LAUNCHER)
    launcher.chmod(0o755)
    b.env["CMAKE_CXX_COMPILER_LAUNCHER"] = str(launcher)


def _torch_cpu(b: Build) -> None:
    site = b.workdir / "torch_cpu"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_TORCH_CPU_SITECUSTOMIZE)
    b.env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(site), b.env.get("PYTHONPATH"))))


def _tensorflow_headers(b: Build) -> None:
    tf_include = _site_packages() / "tensorflow" / "include"
    shim = b.workdir / "xla_shim"
    header = shim / "tensorflow" / "compiler" / "xla" / "client" / "xla_builder.h"
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text(_XLA_SHIM)
    b.add_cxxflags(f"-I{tf_include}/external/highwayhash", f"-I{tf_include}/external/farmhash_archive/src",
                   f"-I{shim}")


def _cffi(b: Build) -> None:
    _pip("install", "--disable-pip-version-check", "-q", f"cffi=={pins.TOOLS['cffi']}")


def _nccl_from_pip(b: Build) -> None:
    """The wheel ships libnccl.so.2 only; the linker looks for libnccl.so: a link in the scratch folder."""
    nccl = b.toolchain.nccl
    links = b.workdir / "nccl_lib"
    links.mkdir(exist_ok=True)
    (links / "libnccl.so").symlink_to(Path(nccl.lib) / "libnccl.so.2")
    b.env.update(HOROVOD_NCCL_INCLUDE=nccl.include, HOROVOD_NCCL_LIB=str(links), HOROVOD_NCCL_LINK="SHARED")


FLATBUFFERS_SPAN = "third_party/flatbuffers/include/flatbuffers/stl_emulation.h"


def _flatbuffers_span(b: Build) -> None:
    """flatbuffers' own fix (google/flatbuffers#7227): span::count_ not const, as its operator= assigns it."""
    header = b.source / FLATBUFFERS_SPAN
    text = header.read_text()
    if "  const size_type count_;" not in text:
        raise ToolkitError(f"build-horovod: gcc14-flatbuffers: {FLATBUFFERS_SPAN} is not the header it patches "
                           f"(Horovod {pins.HOROVOD}'s); drop the row or update it")
    header.write_text(text.replace("  const size_type count_;", "  size_type count_;", 1))


OPERATIONS_CC = "horovod/common/operations.cc"
# Broadcast, alltoall and join log the op's name after queueing it. `name` is a reference into the
# caller's op; MXNet's binding frees that op (DeleteMpiOpsParam) as soon as Horovod's background thread
# finishes it, which under load can come first: the log line then copies freed memory (SIGSEGV in
# EnqueueTensorBroadcast, std::__ostream_insert). Log a copy taken before the op is queued.
_ENQUEUED_LOG = """  Status status = process_set.tensor_queue.AddToTensorQueue(e, message);
  if (status.ok()) {
    LOG(TRACE, horovod_global.global_controller->GetRank())
        << "Enqueued " << name;
  }"""
_ENQUEUED_LOG_FIXED = """  const std::string enqueued_name = name;   // toolkit: `name` may be freed once the op is queued
  Status status = process_set.tensor_queue.AddToTensorQueue(e, message);
  if (status.ok()) {
    LOG(TRACE, horovod_global.global_controller->GetRank())
        << "Enqueued " << enqueued_name;
  }"""


def _enqueued_name_copy(b: Build) -> None:
    source = b.source / OPERATIONS_CC
    text = source.read_text()
    if text.count(_ENQUEUED_LOG) != 3:
        raise ToolkitError(f"build-horovod: mxnet-enqueue-name: {OPERATIONS_CC} is not the file it patches "
                           f"(Horovod {pins.HOROVOD}'s: 3 ops log the name after queueing); drop the row or update it")
    source.write_text(text.replace(_ENQUEUED_LOG, _ENQUEUED_LOG_FIXED))


def _cuda_home(b: Build) -> None:
    home = b.toolchain.cuda_home
    b.env["HOROVOD_CUDA_HOME"] = home
    b.env.setdefault("CUDA_HOME", home)         # torch.utils.cpp_extension looks here, then for nvcc on PATH
    b.env["PATH"] = os.pathsep.join(filter(None, (f"{home}/bin", b.env.get("PATH"))))
    if Path(home, "include", "cccl").is_dir():
        # CUDA 13 moved its C++ core library (<nv/target>, cub, thrust) to include/cccl; nvcc adds it,
        # Horovod's C++ sources that include CUDA's headers need it too
        b.add_cxxflags(f"-isystem {home}/include/cccl")
    lib = Path(home, "lib")
    if not Path(home, "lib64").is_dir() and lib.is_dir():
        # pip's layout (nvidia/cu13/lib): nvcc.profile links from lib64 only, so CMake's compiler
        # check fails on `cannot find -lcudadevrt`, `-lcudart_static` (nvcc reads extra flags from
        # NVCC_APPEND_FLAGS); and the wheels ship libcudart.so.13 but no libcudart.so, so
        # FindCUDAToolkit says `missing: CUDA_CUDART`: unversioned links in the scratch folder,
        # which find_library searches through CMAKE_LIBRARY_PATH
        links = b.workdir / "cuda_lib"
        links.mkdir(exist_ok=True)
        for versioned in sorted(lib.glob("lib*.so.*")):
            plain = versioned.name.split(".so.")[0] + ".so"
            if not (lib / plain).exists() and not (links / plain).exists():
                (links / plain).symlink_to(versioned)
        b.env["NVCC_APPEND_FLAGS"] = " ".join(filter(None, (b.env.get("NVCC_APPEND_FLAGS"), f"-L{lib}")))
        b.env["CMAKE_LIBRARY_PATH"] = os.pathsep.join(filter(None, (str(links), b.env.get("CMAKE_LIBRARY_PATH"))))


def _cuda_archs(b: Build) -> None:
    b.env["HOROVOD_BUILD_CUDA_CC_LIST"] = b.spec.cuda_arch or ",".join(b.toolchain.gpu_archs) or DEFAULT_CUDA_ARCHS


def _gcc_at_least(b: Build, major: int) -> bool:
    return b.toolchain.compiler_id == "gcc" and b.toolchain.compiler_version[:1] >= (major,)


# One row per problem: the error the stock Horovod 0.28.1 build stops with, and what fixes it.
WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround("cxx-std", "torch >= 2.1: `#error C++17 or later compatible compiler is required to use PyTorch` "
               "(Horovod's CMake forces -std=c++14; torch >= 2.14 needs C++20)",
               lambda b: True, _cxx_launcher, "always (a launcher appends -std=c++20 for torch's sources, "
               "-std=c++17 for the rest, after Horovod's flag)"),
    Workaround("torch-cpu-no-cuda-home", "a CPU build against PyPI's CUDA torch: `Could NOT find CUDAToolkit` "
               "(FindPytorch turns CUDA on when torch.version.cuda is set and a CUDA_HOME is found)",
               lambda b: "torch" in b.spec.frameworks and not b.spec.gpu, _torch_cpu,
               "torch, CPU build"),
    Workaround("tensorflow-headers", "TensorFlow >= 2.19: `fatal error: tensorflow/compiler/xla/client/"
               "xla_builder.h: No such file or directory`, then highwayhash's and farmhash's headers",
               lambda b: "tensorflow" in b.spec.frameworks, _tensorflow_headers, "tensorflow"),
    Workaround("gcc13-includes", "GCC >= 13: `horovod/common/group_table.h:35:47: error: 'string' in namespace "
               "'std' does not name a type`, `common.h:343:18: error: 'logic_error' is not a member of 'std'`",
               lambda b: _gcc_at_least(b, 13), lambda b: b.add_cxxflags("-include string", "-include stdexcept"),
               "the C++ compiler is GCC >= 13"),
    Workaround("gcc14-flatbuffers", "GCC >= 14: `third_party/flatbuffers/include/flatbuffers/stl_emulation.h:"
               "549:12: error: assignment of read-only member 'flatbuffers::span<T, Extent>::count_'`",
               lambda b: _gcc_at_least(b, 14), _flatbuffers_span,
               "the C++ compiler is GCC >= 14 (patches the sdist's bundled flatbuffers header as upstream did)"),
    Workaround("mxnet-enqueue-name", "MXNet, rarely and under load: `Segmentation fault: 11` in a rank (SIGSEGV in "
               "`horovod::common::EnqueueTensorBroadcast` -> `std::__ostream_insert`, then `terminate called "
               "without an active exception`): the trace log after queueing a broadcast reads the op's name, "
               "which MXNet's binding frees as soon as the op is done",
               lambda b: "mxnet" in b.spec.frameworks, _enqueued_name_copy,
               "mxnet (patches horovod/common/operations.cc: the name is copied before the op is queued; "
               "named in the cache key)", in_key=True),
    Workaround("cmake4-policy", "CMake >= 4: `third_party/gloo/CMakeLists.txt:1 (cmake_minimum_required): "
               "Compatibility with CMake < 3.5 has been removed from CMake.`",
               lambda b: b.toolchain.cmake_version[:1] >= (4,) and "CMAKE_POLICY_VERSION_MINIMUM" not in b.env,
               lambda b: b.env.update(CMAKE_POLICY_VERSION_MINIMUM="3.5"), "CMake >= 4"),
    Workaround("cffi-first", "torch: `Could not find a version that satisfies the requirement cffi>=1.4.0` "
               "(Horovod's setup_requires, fetched at build time: fails without a package index)",
               lambda b: "torch" in b.spec.frameworks and not b.toolchain.cffi, _cffi,
               "torch, and cffi not installed (installed first, at the pinned version)"),
    Workaround("nccl-from-pip", "GPU build without a system NCCL: `Could NOT find NCCL (missing: "
               "NCCL_INCLUDE_DIR NCCL_LIBRARY)`; the nvidia-nccl-cu* wheel has libnccl.so.2 but no libnccl.so",
               lambda b: b.spec.gpu and b.toolchain.nccl is not None and b.toolchain.nccl.source != "system"
               and "HOROVOD_NCCL_HOME" not in b.env and "HOROVOD_NCCL_LIB" not in b.env,
               _nccl_from_pip, "GPU build, NCCL from a pip wheel (see toolchain.pick_nccl)"),
    Workaround("nvcc-from-pip", "GPU build, CUDA's compiler from a pip wheel: `Could not find nvcc. Make sure it "
               "is added to your path or in $HOROVOD_CUDA_HOME/bin.`, then CMake's CUDA compiler check: "
               "`ld: cannot find -lcudadevrt` (the wheels put CUDA's libraries in lib/, nvcc links from lib64/), "
               "then `Could NOT find CUDAToolkit (missing: CUDA_CUDART)` (libcudart.so.13, no libcudart.so), "
               "then CUDA 13's `cuda_fp16.h: fatal error: nv/target: No such file or directory` (include/cccl)",
               lambda b: b.spec.gpu and b.toolchain.cuda_home is not None and "HOROVOD_CUDA_HOME" not in b.env,
               _cuda_home, "GPU build (HOROVOD_CUDA_HOME, and CUDA_HOME for torch's extension builder, from the "
               "nvcc found, wheel or system)"),
    Workaround("cuda-arch", "GPU build: Horovod's default architecture list starts at sm_35: `nvcc fatal : "
               "Unsupported gpu architecture 'compute_35'` on CUDA >= 12",
               lambda b: b.spec.gpu and "HOROVOD_BUILD_CUDA_CC_LIST" not in b.env, _cuda_archs,
               f"GPU build: --cuda-arch, else the GPUs present (nvidia-smi), else {DEFAULT_CUDA_ARCHS}"),
)


def build_env(spec: BuildSpec, workdir: Path, base_env: dict[str, str],
              toolchain: toolchain_mod.Toolchain | None = None,
              source: Path | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment for `pip wheel <source>` (framework switches, the workarounds that apply, some
    of which patch `source`, the unpacked sdist) and the names of those workarounds."""
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
    for item in spec.extra_env:      # the user's --env first: a workaround leaves what they set alone
        key, value = item.split("=", 1)
        env[key] = value
    build = Build(spec, toolchain or toolchain_mod.detect(env), workdir, env, source)
    applied = []
    for w in WORKAROUNDS:
        if w.applies(build):
            w.apply(build)
            applied.append(w.name)
    for item in spec.extra_env:      # ... and wins over them
        key, value = item.split("=", 1)
        env[key] = value
    return env, applied


def explain(spec: BuildSpec, toolchain: toolchain_mod.Toolchain) -> str:
    """The table for this machine: each workaround, whether it applies here, the error it fixes."""
    with tempfile.TemporaryDirectory() as tmp:
        build = Build(spec, toolchain, Path(tmp), dict(os.environ))
        rows = [f"{'applies' if w.applies(build) else '-':8} {w.name:24} when: {w.when}\n{'':33} fixes: {w.fixes}"
                for w in WORKAROUNDS]
    lines = [f"toolchain: {toolchain.describe()}"]
    if spec.gpu:
        lines.append(f"NCCL: {toolchain.nccl.describe() if toolchain.nccl else 'none found'}; "
                     f"nvcc: {toolchain.nvcc or 'none found'}")
    return "\n".join(lines + rows)


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


def _install(wheel: Path, key: str, data: dict | None = None) -> None:
    _pip("install", "--no-deps", "--force-reinstall", "--no-compile", str(wheel))
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("horovod")
    package = Path(list(spec.submodule_search_locations)[0])
    (package / MARKER).write_text(key + "\n")
    if data is not None:
        (package / BUILD_INFO).write_text(json.dumps(data, indent=1) + "\n")


def installed_build() -> dict | None:
    """The manifest of the Horovod build installed here (toolchain, workarounds, NCCL), if recorded."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    info = Path(list(spec.submodule_search_locations)[0]) / BUILD_INFO
    try:
        return json.loads(info.read_text())
    except (OSError, ValueError):
        return None


def _verify(spec: BuildSpec, where: str) -> None:
    bad = {fw: why for fw, why in extension_status(spec.frameworks).items() if why}
    if bad:
        raise ToolkitError(f"build-horovod: {where}, but these extensions do not import: "
                           + "; ".join(f"{fw}: {why}" for fw, why in bad.items()))


def _cached_manifest(folder: Path, spec: BuildSpec, versions: dict, key: str, wheel: Path) -> dict:
    try:
        return json.loads((folder / wheelhouse.MANIFEST).read_text())
    except (OSError, ValueError):      # cached before manifests were written: what the key shows
        data = wheelhouse.manifest(spec, versions, key, wheel)
        wheelhouse.write_manifest(folder, data)
        return data


def build_and_install(spec: BuildSpec, force: bool = False, sdist: str | None = None, say=print,
                      export: str | None = None, wheel_dir: str | None = None) -> Path:
    """Install Horovod for `spec`: from `wheel_dir` (a wheelhouse: no compiling), or from the cache when
    it holds this key, else build, verify, cache. `export`: copy the wheel and its manifest there."""
    versions = framework_versions(spec.frameworks)
    key = cache_key(spec, versions)
    if wheel_dir:
        wheel, data = wheelhouse.find(wheel_dir, key, versions, spec)
        if installed_key() == key and (installed_build() or {}).get("sha256") == data["sha256"]:
            say(f"horovod: already installed from {wheel}")
        else:
            say(f"horovod: installing {wheel} from the wheelhouse (built {data['built']}; toolchain: {data['toolchain']})")
            _install(wheel, key, data)
            _verify(spec, f"installed {wheel}")
        return wheel
    folder = cache_dir() / key
    cached = sorted(folder.glob("horovod-*.whl"))
    if not force and installed_key() == key:     # checked first: no compiler, no cache needed
        say(f"horovod: already installed, the build cached in {cached[0] if cached else folder}")
        if not export:
            return cached[0] if cached else folder
        if not cached:
            raise ToolkitError(f"--export: the installed Horovod ({key}) has no cached wheel in {folder}; "
                               f"rebuild it with `toolkit build-horovod --force --export {export}`")
        wheel, data = cached[0], _cached_manifest(folder, spec, versions, key, cached[0])
    elif cached and not force:
        wheel, data = cached[0], _cached_manifest(folder, spec, versions, key, cached[0])
        say(f"horovod: installing cached wheel {wheel}")
        _install(wheel, key, data)
    else:
        wheel, data = _build(spec, versions, key, folder, sdist, say)
    if export:
        say(f"horovod: exported {wheel.name} and its {wheelhouse.MANIFEST} to "
            f"{wheelhouse.export(wheel, data, export)}")
    return wheel


def _unpack(sdist: str | None, work: Path) -> Path:
    """Horovod's sdist (the one given, else pip's download of the pinned one), unpacked for the
    workarounds that patch it; the folder pip builds."""
    if sdist is None:
        _pip("download", "--no-deps", "--no-binary", "horovod", "--disable-pip-version-check", "-q",
             "-d", str(work / "sdist"), f"horovod=={pins.HOROVOD}")
        sdist = str(next((work / "sdist").glob("horovod-*.tar.gz")))
    if not Path(sdist).is_file():
        raise ToolkitError(f"--sdist {sdist}: no such file; give horovod-{pins.HOROVOD}.tar.gz")
    with tarfile.open(sdist) as tar:     # the "data" filter where this Python has it (3.11.4+)
        tar.extractall(work / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    tops = [p for p in (work / "src").iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / "setup.py").is_file():
        raise ToolkitError(f"--sdist {sdist}: not a Horovod sdist (one folder holding setup.py)")
    return tops[0]


def first_errors(log_path: Path, count: int = 5) -> str:
    """The compiler's and CMake's first error lines of a failed build's log (the tail is pip's traceback)."""
    lines = log_path.read_text(errors="replace").splitlines()
    errors = [ln.strip() for ln in lines if re.search(r"(\berror:|^CMake Error|fatal error)", ln.strip())]
    shown = errors[:count] or lines[-20:]
    return f"{'first errors' if errors else 'last lines'} in {log_path}:\n" + "\n".join(shown)


def _build(spec: BuildSpec, versions: dict, key: str, folder: Path, sdist: str | None, say) -> tuple[Path, dict]:
    if not shutil.which("cmake"):
        raise ToolkitError("build-horovod: cmake not found; install it (apt-get install cmake), or install a "
                           "build made elsewhere with --wheelhouse DIR")
    if spec.mpi and not shutil.which("mpicxx"):
        raise ToolkitError("build-horovod: mpicxx not found; install Open MPI "
                           f"(apt-get install {' '.join(pins.APT_PACKAGES)}) or pass --no-mpi")
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "build.log"
    say(f"horovod: building {pins.HOROVOD} for {', '.join(spec.frameworks)} "
        f"({'NCCL' if spec.gpu else 'CPU'} ops); log: {log_path} (about 10-20 min on 2 cores)")
    with tempfile.TemporaryDirectory(prefix="toolkit-hvd-") as tmp:
        work = Path(tmp)
        toolchain = toolchain_mod.detect()
        source = _unpack(sdist, work)
        env, applied = build_env(spec, work, dict(os.environ), toolchain, source)
        say(f"horovod: toolchain {toolchain.describe()}; workarounds: {', '.join(applied) or 'none'}")
        target = str(source)
        with open(log_path, "w") as log:
            log.write(f"toolkit: toolchain {toolchain.describe()}; workarounds: {', '.join(applied) or 'none'}\n")
            log.flush()
            try:
                # --no-cache-dir: pip's own wheel cache is keyed by the sdist alone and would hand back
                # a wheel built against other framework versions (seen when torch's pin moved)
                _pip("wheel", "--no-build-isolation", "--no-deps", "--no-binary", "horovod", "--no-cache-dir", "-v",
                     "-w", str(work / "dist"), target, env=env, log=log)
            except ToolkitError as e:
                raise ToolkitError(f"{e}; {first_errors(log_path)}") from None
        wheel = next((work / "dist").glob("horovod-*.whl"))
        data = wheelhouse.manifest(spec, versions, key, wheel, toolchain, applied)
        _install(wheel, key, data)
        _verify(spec, f"built (see {log_path})")
        final = folder / wheel.name
        partial = folder / (wheel.name + ".partial")
        shutil.copyfile(wheel, partial)
        os.replace(partial, final)
        wheelhouse.write_manifest(folder, data)
    say(f"horovod: built and cached {final}")
    return final, data
