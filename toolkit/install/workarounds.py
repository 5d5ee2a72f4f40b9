"""The workaround table: one row per error the stock Horovod 0.28.1 build stops with on today's
frameworks and toolchains (or that the built Horovod then hits at run time), with when it applies
(judged from the detected toolchain, toolkit/install/toolchain.py) and what fixes it: the build's
environment and flags here, the rows' edits of Horovod's sources in toolkit/install/horovod_patches.py.
toolkit/install/horovod.py applies the rows that apply; `toolkit build-horovod --explain` prints the
table for this machine. Stdlib only.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from toolkit.errors import ToolkitError
from toolkit.install import horovod_patches as patches
from toolkit.install import pins
from toolkit.install import toolchain as toolchain_mod

if TYPE_CHECKING:
    from toolkit.install.buildspec import BuildSpec

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
    apply: Callable[[Build], None] | None        # the environment and flags (None: a row of edits alone)
    when: str                                    # `applies` in words
    # Changes what the built code does (not only whether it compiles): the cache key names it and hashes
    # its edits, so a wheel built without it, or with other edits, is never reused. Such a row's
    # `applies` reads b.spec alone.
    in_key: bool = False
    edits: tuple[patches.Edit, ...] = ()         # its patches to the unpacked sdist (horovod_patches.py)

    def run(self, b: Build) -> None:
        if self.edits and b.source is not None:   # no sdist: the environment alone (build_env's tests, --explain)
            patches.apply_edits(b.source, self.name, self.edits)
        if self.apply is not None:
            self.apply(b)


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
    pip("install", "--disable-pip-version-check", "-q", f"cffi=={pins.TOOLS['cffi']}")


def _nccl_from_pip(b: Build) -> None:
    """The wheel ships libnccl.so.2 only; the linker looks for libnccl.so: a link in the scratch folder."""
    nccl: toolchain_mod.Nccl = b.toolchain.nccl     # type: ignore[assignment]  # the row applies with one
    links = b.workdir / "nccl_lib"
    links.mkdir(exist_ok=True)
    (links / "libnccl.so").symlink_to(Path(nccl.lib) / "libnccl.so.2")
    b.env.update(HOROVOD_NCCL_INCLUDE=nccl.include, HOROVOD_NCCL_LIB=str(links), HOROVOD_NCCL_LINK="SHARED")


def _cuda_home(b: Build) -> None:
    home: str = b.toolchain.cuda_home               # type: ignore[assignment]  # the row applies with one
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
               lambda b: _gcc_at_least(b, 14), None,
               "the C++ compiler is GCC >= 14 (patches the sdist's bundled flatbuffers header as upstream did)",
               edits=patches.FLATBUFFERS_EDITS),
    Workaround("mxnet-enqueue-name", "MXNet, rarely and under load: `Segmentation fault: 11` in a rank (SIGSEGV in "
               "`horovod::common::EnqueueTensorBroadcast` -> `std::__ostream_insert`, then `terminate called "
               "without an active exception`): the trace log after queueing a broadcast reads the op's name, "
               "which MXNet's binding frees as soon as the op is done",
               lambda b: "mxnet" in b.spec.frameworks, None,
               "mxnet (patches horovod/common/operations.cc: the name is copied before the op is queued; "
               "named in the cache key)", in_key=True, edits=patches.ENQUEUED_NAME_EDITS),
    Workaround("keras3-api", "TensorFlow >= 2.16 (Keras 3): `AttributeError: 'Variable' object has no attribute "
               "'ref'` in `hvd.DistributedGradientTape` (horovod#4290), then `'SymbolicTensor' object has no "
               "attribute 'assign'` in `hvd.broadcast_variables`, `'list' object is not callable` "
               "(`optimizer.variables()`), `keras.backend` has no `constant`; `hvd.DistributedOptimizer` on a "
               "Keras 3 optimizer never allreduces (Keras 3 applies gradients in `apply()`)",
               lambda b: "tensorflow" in b.spec.frameworks, None,
               "tensorflow (patches horovod/tensorflow and horovod/_keras; backward_passes_per_step > 1 on a "
               "Keras 3 optimizer is refused in one line; named in the cache key)",
               in_key=True, edits=patches.KERAS3_EDITS),
    Workaround("launcher-no-framework", "every `horovodrun` job: TensorFlow's C++ start-up lines (`WARNING: All log "
               "messages before absl::InitializeLog()`, cpu_feature_guard) from the launcher itself, and "
               "TensorFlow's import before any rank starts, even for a torch job: horovodrun asks which "
               "controllers were built by importing a framework extension, TensorFlow first",
               lambda b: True, None,
               "always (the build records MPI and Gloo in horovod/metadata.json, horovodrun reads them there; "
               "named in the cache key)", in_key=True, edits=patches.LAUNCHER_EDITS),
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


def pip(*args: str, env=None, log=None) -> None:
    """Run pip in this environment; output to `log` if given, else kept for the error message."""
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)
    if proc.returncode != 0:
        tail = "" if log else "\n" + "\n".join((proc.stdout or "").splitlines()[-20:])
        raise ToolkitError(f"`pip {' '.join(args[:3])} ...` failed (exit {proc.returncode}){tail}")
