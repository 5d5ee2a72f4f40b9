"""What this machine builds Horovod with, detected: the C++ compiler, CMake, Python, cffi, NCCL (the
system's or an `nvidia-nccl-cu*` wheel's), CUDA's compiler (the system's or a pip wheel's) and the
GPUs present. `toolkit build-horovod` picks its workarounds from this (toolkit/install/workarounds.py),
`toolkit doctor` prints it. Stdlib only (runs before anything is installed).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

SYSTEM_NCCL_INCLUDES = ("/usr/include", "/usr/local/cuda/include", "/usr/local/include")
SYSTEM_NCCL_LIBS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/cuda/lib64",
                    "/usr/lib64", "/usr/local/lib")


@dataclass(frozen=True)
class Nccl:
    source: str              # "system" or the wheel's distribution, e.g. "nvidia-nccl-cu13"
    include: str             # the folder holding nccl.h
    lib: str                 # the folder holding libnccl.so*
    version: str             # from nccl.h: "2.28.3"

    def describe(self) -> str:
        return f"NCCL {self.version} from {'the system' if self.source == 'system' else 'pip (' + self.source + ')'}" \
               f" ({self.include})"


@dataclass(frozen=True)
class Toolchain:
    python: tuple[int, int]
    compiler: str                            # the C++ compiler's command
    compiler_id: str                         # "gcc", "clang" or "unknown"
    compiler_version: tuple[int, ...]        # () when unknown
    cmake_version: tuple[int, ...]           # () when CMake is missing
    cffi: bool
    nccl: Nccl | None = None                 # the NCCL a GPU build uses (see pick_nccl)
    other_nccl: Nccl | None = None           # the one not used, when both are there
    nvcc: str | None = None                  # CUDA's compiler
    cuda_home: str | None = None             # nvcc's CUDA root (bin/nvcc, include/cuda_runtime.h)
    gpu_archs: tuple[str, ...] = field(default_factory=tuple)   # compute capabilities present: ("90",)

    def describe(self) -> str:
        if not shutil.which(self.compiler):
            cxx = f"no C++ compiler ({self.compiler})"
        else:
            cxx = f"{self.compiler_id.upper() if self.compiler_id == 'gcc' else self.compiler_id} " \
                  f"{_dotted(self.compiler_version) or '?'}"
        cmake = f"CMake {_dotted(self.cmake_version)}" if self.cmake_version else "no CMake"
        return f"{cxx}, {cmake}, Python {self.python[0]}.{self.python[1]}"


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _version(text: str) -> tuple[int, ...]:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def _output(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr if proc.returncode == 0 else ""


def compiler(env: Mapping[str, str] | None = None) -> tuple[str, str, tuple[int, ...]]:
    """(command, "gcc" | "clang" | "unknown", version) of the C++ compiler CMake will pick: $CXX, else c++."""
    env = os.environ if env is None else env
    cxx = (env.get("CXX") or "c++").split()[0]
    banner = _output([cxx, "--version"])
    ident = "clang" if "clang" in banner else "gcc" if re.search(r"\b(g\+\+|gcc|GCC|Free Software)", banner) \
        else "unknown"
    version = _version(_output([cxx, "-dumpfullversion", "-dumpversion"]).strip()) if ident == "gcc" else \
        _version(banner)
    return cxx, ident, version


def cmake_version() -> tuple[int, ...]:
    return _version(_output(["cmake", "--version"]).splitlines()[0]) if shutil.which("cmake") else ()


def _header_version(header: Path) -> str:
    text = header.read_text(errors="replace")
    parts = [re.search(rf"#define\s+NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) or "?"


def _has_nccl_library(folder: Path) -> bool:
    return folder.is_dir() and (any(folder.glob("libnccl.so*")) or (folder / "libnccl_static.a").is_file())


def system_nccl(env: Mapping[str, str] | None = None) -> Nccl | None:
    """nccl.h and libnccl.so* where Horovod's FindNCCL looks (HOROVOD_NCCL_* first, then the usual places)."""
    env = os.environ if env is None else env
    home = env.get("HOROVOD_NCCL_HOME")
    includes = [env.get("HOROVOD_NCCL_INCLUDE"), home and f"{home}/include", *SYSTEM_NCCL_INCLUDES]
    libs = [env.get("HOROVOD_NCCL_LIB"), home and f"{home}/lib", home and f"{home}/lib64", *SYSTEM_NCCL_LIBS]
    include = next((Path(d) for d in includes if d and (Path(d) / "nccl.h").is_file()), None)
    lib = next((Path(d) for d in libs if d and _has_nccl_library(Path(d))), None)
    if include is None or lib is None:
        return None
    return Nccl("system", str(include), str(lib), _header_version(include / "nccl.h"))


def _wheel_files(prefix: str, wanted: tuple[str, ...]) -> dict[str, Path]:
    """Files whose names end with `wanted` in the installed distributions named `prefix*`."""
    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if not name.startswith(prefix):
            continue
        for f in dist.files or ():
            for end in wanted:
                if str(f).endswith(end) and end not in found:
                    found[end] = Path(dist.locate_file(f))    # type: ignore[arg-type]  # a Path at run time
                    found["dist:" + end] = Path(name)
    return found


def pip_nccl() -> Nccl | None:
    """The NCCL of an installed `nvidia-nccl-cu*` wheel (torch's CUDA wheels bring one)."""
    found = _wheel_files("nvidia-nccl-cu", ("include/nccl.h", "libnccl.so.2"))
    if "include/nccl.h" not in found or "libnccl.so.2" not in found:
        return None
    header = found["include/nccl.h"]
    return Nccl(str(found["dist:include/nccl.h"]), str(header.parent), str(found["libnccl.so.2"].parent),
                _header_version(header))


def pick_nccl(system: Nccl | None, wheel: Nccl | None) -> tuple[Nccl | None, Nccl | None]:
    """(used, not used). The wheel's when there is one and the system's version differs (torch loads the
    wheel's libnccl.so.2 at run time: one NCCL per process); the system's when it is the same version
    or there is no wheel."""
    if system and wheel:
        return (system, wheel) if system.version == wheel.version else (wheel, system)
    return system or wheel, None


def nvcc(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(nvcc, its CUDA root): HOROVOD_CUDA_HOME, CUDA_HOME, PATH, /usr/local/cuda, then a pip wheel's
    (`nvidia-cuda-nvcc-cu*`, or CUDA 13's `nvidia-cuda-nvcc` in nvidia/cu13)."""
    env = os.environ if env is None else env
    for home in (env.get("HOROVOD_CUDA_HOME"), env.get("CUDA_HOME"), env.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc"), home
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        return on_path, str(Path(on_path).resolve().parent.parent)
    if Path("/usr/local/cuda/bin/nvcc").is_file():
        return "/usr/local/cuda/bin/nvcc", "/usr/local/cuda"
    found = _wheel_files("nvidia-cuda-nvcc", ("bin/nvcc",))
    if "bin/nvcc" in found:
        path = found["bin/nvcc"]
        return str(path), str(path.parent.parent)
    return None, None


def gpu_archs() -> tuple[str, ...]:
    """Compute capabilities of the GPUs present ("9.0" -> "90"), from nvidia-smi; () without GPUs."""
    if not shutil.which("nvidia-smi"):
        return ()
    out = _output(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"])
    return tuple(sorted({line.strip().replace(".", "") for line in out.splitlines()
                         if re.fullmatch(r"\d+\.\d+", line.strip())}))


def detect(env: dict | None = None) -> Toolchain:
    cxx, ident, version = compiler(env)
    import importlib.util
    used, other = pick_nccl(system_nccl(env), pip_nccl())
    nv, home = nvcc(env)
    return Toolchain(python=sys.version_info[:2], compiler=cxx, compiler_id=ident, compiler_version=version,
                     cmake_version=cmake_version(), cffi=importlib.util.find_spec("cffi") is not None,
                     nccl=used, other_nccl=other, nvcc=nv, cuda_home=home, gpu_archs=gpu_archs())


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


# oneDNN's bfloat16 kernels (torch's CPU autocast, MXNet's AMP) run on AVX-512 (avx512_core: F, BW, VL,
# DQ; native bf16 dot products with avx512_bf16 or AMX). Without it MXNet's bf16 operators fail and
# torch's are emulated, ~20x slower than fp32 (ResNet-18, AVX2-only AMD EPYC, docs/BENCHMARKS.md).
AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (Linux); empty where they cannot be read."""
    try:
        with open(path) as f:
            return next((frozenset(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")),
                        frozenset())
    except OSError:
        return frozenset()


def cpu_runs_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether oneDNN has bfloat16 kernels for this CPU (True where the flags cannot be read)."""
    flags = cpu_flags() if flags is None else flags
    return not flags or AVX512_CORE <= flags
