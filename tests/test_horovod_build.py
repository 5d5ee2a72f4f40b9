"""The Horovod build recipe: switches, workarounds and the cache key (no compiling here)."""
import os
from pathlib import Path

import pytest

from toolkit.build import horovod as hb, toolchain as tc, workarounds as wa
from toolkit.errors import ToolkitError

# This machine's kind of toolchain (Debian 12), written out: the tests below change one thing at a time.
TOOLCHAIN = tc.Toolchain(python=(3, 11), compiler="c++", compiler_id="gcc", compiler_version=(12, 2, 0),
                         cmake_version=(3, 25, 1), cffi=True)


def test_env_has_the_workarounds(tmp_path):
    ops = tmp_path / "src" / wa.OPERATIONS_CC      # a stand-in: the three ops that log a queued name
    ops.parent.mkdir(parents=True)
    ops.write_text("\n}\n".join([wa._ENQUEUED_LOG] * 3))
    env, applied = hb.build_env(hb.BuildSpec(), tmp_path, {"CXXFLAGS": "-O2", "HOROVOD_WITHOUT_MXNET": "1"},
                                TOOLCHAIN, source=tmp_path / "src")
    assert applied == ["cxx-std", "torch-cpu-no-cuda-home", "tensorflow-headers", "mxnet-enqueue-name"]
    assert ops.read_text().count("<< enqueued_name;") == 3
    assert env["HOROVOD_WITH_PYTORCH"] == env["HOROVOD_WITH_TENSORFLOW"] == env["HOROVOD_WITH_MXNET"] == "1"
    assert "HOROVOD_WITHOUT_MXNET" not in env, "a stale opposite switch must be removed"
    assert env["HOROVOD_WITH_MPI"] == env["HOROVOD_WITH_GLOO"] == "1"
    assert "HOROVOD_GPU_OPERATIONS" not in env
    launcher = env["CMAKE_CXX_COMPILER_LAUNCHER"]
    assert open(launcher).read().strip().endswith('exec "$@" -std=c++17')
    flags = env["CXXFLAGS"].split()
    assert flags[0] == "-O2"
    assert any(f.endswith("external/highwayhash") for f in flags)
    assert any(f.endswith("external/farmhash_archive/src") for f in flags)
    shim = next(f[2:] for f in flags if f.endswith("xla_shim"))
    header = f"{shim}/tensorflow/compiler/xla/client/xla_builder.h"
    assert open(header).read().strip() == '#include "xla/hlo/builder/xla_builder.h"'


def test_gpu_and_subset(tmp_path):
    env, _ = hb.build_env(hb.BuildSpec(frameworks=("torch",), gpu=True, mpi=False, extra_env=("HOROVOD_DEBUG=1",)),
                          tmp_path, {}, TOOLCHAIN)
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_WITHOUT_TENSORFLOW"] == env["HOROVOD_WITHOUT_MXNET"] == env["HOROVOD_WITHOUT_MPI"] == "1"
    assert env["HOROVOD_DEBUG"] == "1"
    assert "xla_shim" not in env.get("CXXFLAGS", "")


def test_cache_key_changes_with_every_input():
    versions = {"torch": "torch==2.13.0", "tensorflow": "tensorflow-cpu==2.21.0", "mxnet": "mxnet==1.9.1"}
    base = hb.cache_key(hb.BuildSpec(), versions)
    assert "torch2.13.0" in base and "tensorflow-cpu2.21.0" in base and "horovod0.28.1" in base
    keys = {base,
            hb.cache_key(hb.BuildSpec(), {**versions, "torch": "torch==2.14.0"}),
            hb.cache_key(hb.BuildSpec(gpu=True), versions),
            hb.cache_key(hb.BuildSpec(gloo=False), versions),
            hb.cache_key(hb.BuildSpec(extra_env=("A=1",)), versions)}
    assert len(keys) == 5
    # a build with MXNet carries the patch that changes its code: an unpatched cached wheel is not reused
    assert base.endswith("_mxnet-enqueue-name")
    assert "enqueue" not in hb.cache_key(hb.BuildSpec(frameworks=("torch",)), {"torch": versions["torch"]})


@pytest.mark.parametrize("kwargs, needle", [
    (dict(frameworks=("jax",)), "unknown jax"),
    (dict(frameworks=()), "at least one"),
    (dict(mpi=False, gloo=False), "no controller"),
    (dict(extra_env=("NOEQUALS",)), "KEY=VALUE"),
    (dict(cuda_arch="90"), "--cuda-arch applies to GPU builds"),
    (dict(gpu=True, cuda_arch="9.0"), "without the dot"),
])
def test_bad_specs(kwargs, needle):
    with pytest.raises(ToolkitError, match=needle):
        hb.BuildSpec(**kwargs)


def test_a_cpu_build_does_not_turn_on_cuda_for_pypis_torch(tmp_path):
    """PyPI's torch is a CUDA build; with any CUDA_HOME torch finds (an nvcc on PATH, /usr/local/cuda),
    Horovod's CMake would build its torch extension with CUDA and fail on missing CUDA headers. The
    CPU build's environment makes torch report none; the GPU build keeps it."""
    import subprocess
    import sys
    env, _ = hb.build_env(hb.BuildSpec(frameworks=("torch",)), tmp_path, dict(os.environ))
    probe = "from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "None", out
    assert "PYTHONPATH" not in hb.build_env(hb.BuildSpec(frameworks=("torch",), gpu=True), tmp_path, {}, TOOLCHAIN)[0]


def _applied(tmp_path, spec=hb.BuildSpec(frameworks=("torch",)), base=None, **changes):
    import dataclasses
    return hb.build_env(spec, tmp_path, dict(base or {}), dataclasses.replace(TOOLCHAIN, **changes))


@pytest.mark.parametrize("compiler_id, version, includes, patch", [
    ("gcc", (12, 2, 0), False, False), ("gcc", (13, 3, 0), True, False), ("gcc", (14, 2, 0), True, True),
    ("clang", (18, 1), False, False)])
def test_gcc_13_gets_the_missing_includes_and_gcc_14_the_flatbuffers_fix(tmp_path, compiler_id, version, includes,
                                                                           patch):
    import dataclasses
    header = tmp_path / "src" / wa.FLATBUFFERS_SPAN
    header.parent.mkdir(parents=True)
    header.write_text("  FLATBUFFERS_CONSTEXPR_CPP14 span &operator=(...)\n  const size_type count_;\n")
    env, applied = hb.build_env(hb.BuildSpec(frameworks=("torch",)), tmp_path, {},
                                dataclasses.replace(TOOLCHAIN, compiler_id=compiler_id, compiler_version=version),
                                source=tmp_path / "src")
    assert ("gcc13-includes" in applied) == includes
    assert ("-include string -include stdexcept" in env.get("CXXFLAGS", "")) == includes
    assert ("gcc14-flatbuffers" in applied) == patch
    assert ("  size_type count_;" in header.read_text().splitlines()) == patch


def test_the_source_patches_match_horovods_own_files(tmp_path):
    """The patched lines are in Horovod 0.28.1's sdist (pip's download; skipped without an index):
    flatbuffers' span, and the three ops that log their name after queueing it (MXNet frees it)."""
    import tarfile
    proc = __import__("subprocess").run([__import__("sys").executable, "-m", "pip", "download", "--no-deps",
                                         "--no-binary", "horovod", "-q", "-d", str(tmp_path), "horovod==0.28.1"],
                                        capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip("no package index to download Horovod's sdist from")
    source = hb._unpack(str(next(tmp_path.glob("horovod-*.tar.gz"))), tmp_path / "work")
    build = wa.Build(hb.BuildSpec(), TOOLCHAIN, tmp_path, {}, source)
    wa._flatbuffers_span(build)
    assert "  size_type count_;" in (source / wa.FLATBUFFERS_SPAN).read_text().splitlines()
    wa._enqueued_name_copy(build)
    ops = (source / wa.OPERATIONS_CC).read_text()
    assert ops.count('<< "Enqueued " << enqueued_name;') == 3 and '<< "Enqueued " << name;' not in ops
    with pytest.raises(ToolkitError, match="mxnet-enqueue-name: horovod/common/operations.cc is not the file"):
        wa._enqueued_name_copy(build)           # applied twice (or another Horovod): refused, not half-done


def test_cmake_4_gets_the_policy_variable_unless_it_is_set(tmp_path):
    assert "CMAKE_POLICY_VERSION_MINIMUM" not in _applied(tmp_path, cmake_version=(3, 31, 6))[0]
    assert _applied(tmp_path, cmake_version=(4, 4, 0))[0]["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"
    env, applied = _applied(tmp_path, base={"CMAKE_POLICY_VERSION_MINIMUM": "3.10"}, cmake_version=(4, 4, 0))
    assert env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.10" and "cmake4-policy" not in applied
    env, applied = _applied(tmp_path, spec=hb.BuildSpec(frameworks=("torch",), extra_env=("CMAKE_POLICY_VERSION_MINIMUM=3.12",)),
                            cmake_version=(4, 4, 0))
    assert env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.12" and "cmake4-policy" not in applied


def test_cffi_is_installed_first_only_for_torch_and_only_when_missing(tmp_path):
    build = wa.Build(hb.BuildSpec(frameworks=("torch",)), TOOLCHAIN, tmp_path, {})
    cffi = next(w for w in wa.WORKAROUNDS if w.name == "cffi-first")
    assert not cffi.applies(build)
    build.toolchain = tc.Toolchain(**{**TOOLCHAIN.__dict__, "cffi": False})
    assert cffi.applies(build)
    build.spec = hb.BuildSpec(frameworks=("tensorflow",))
    assert not cffi.applies(build)


def _fake_nccl(root, version=(2, 28, 3)):
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "nccl.h").write_text("".join(f"#define NCCL_{k} {v}\n"
                                                     for k, v in zip(("MAJOR", "MINOR", "PATCH"), version)))
    (root / "lib" / "libnccl.so.2").write_bytes(b"")
    return root


def test_nccl_from_a_wheel_gets_its_unversioned_link_and_shared_linking(tmp_path):
    wheel = _fake_nccl(tmp_path / "nvidia" / "nccl")
    nccl = tc.Nccl("nvidia-nccl-cu13", str(wheel / "include"), str(wheel / "lib"), "2.28.3")
    env, applied = _applied(tmp_path, spec=hb.BuildSpec(frameworks=("torch",), gpu=True), nccl=nccl)
    assert "nccl-from-pip" in applied and env["HOROVOD_NCCL_LINK"] == "SHARED"
    assert env["HOROVOD_NCCL_INCLUDE"] == str(wheel / "include")
    link = Path(env["HOROVOD_NCCL_LIB"]) / "libnccl.so"
    assert link.is_symlink() and link.resolve() == (wheel / "lib" / "libnccl.so.2").resolve()
    system = tc.Nccl("system", "/usr/include", "/usr/lib/x86_64-linux-gnu", "2.28.3")
    assert "nccl-from-pip" not in _applied(tmp_path, spec=hb.BuildSpec(frameworks=("torch",), gpu=True),
                                           nccl=system)[1]
    assert "nccl-from-pip" not in _applied(tmp_path, nccl=nccl)[1], "a CPU build needs no NCCL"


def test_which_nccl_is_used_and_its_version_is_read_from_the_header(tmp_path):
    system = tc.system_nccl({"HOROVOD_NCCL_HOME": str(_fake_nccl(tmp_path / "sys", (2, 21, 5)))})
    assert system.source == "system" and system.version == "2.21.5"
    wheel = tc.Nccl("nvidia-nccl-cu13", "/w/include", "/w/lib", "2.28.3")
    assert tc.pick_nccl(system, wheel) == (wheel, system), "torch loads the wheel's at run time: build with that"
    same = tc.Nccl("system", "/usr/include", "/usr/lib", "2.28.3")
    assert tc.pick_nccl(same, wheel) == (same, wheel)
    assert tc.pick_nccl(None, wheel) == (wheel, None) and tc.pick_nccl(system, None) == (system, None)


def test_cuda_architectures_from_the_flag_then_the_gpus_present_then_a_default(tmp_path):
    gpu = hb.BuildSpec(frameworks=("torch",), gpu=True)
    assert _applied(tmp_path, spec=gpu)[0]["HOROVOD_BUILD_CUDA_CC_LIST"] == wa.DEFAULT_CUDA_ARCHS
    assert _applied(tmp_path, spec=gpu, gpu_archs=("90",))[0]["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    flag = hb.BuildSpec(frameworks=("torch",), gpu=True, cuda_arch="80,90")
    assert _applied(tmp_path, spec=flag, gpu_archs=("90",))[0]["HOROVOD_BUILD_CUDA_CC_LIST"] == "80,90"
    assert "HOROVOD_BUILD_CUDA_CC_LIST" not in _applied(tmp_path)[0]
    assert "35" not in wa.DEFAULT_CUDA_ARCHS.split(",") and "70" not in wa.DEFAULT_CUDA_ARCHS.split(",")


def test_this_machines_toolchain_is_detected_and_explained():
    import re
    import shutil
    import subprocess
    found = tc.detect()
    gcc = subprocess.run(["c++", "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    assert found.compiler_id == "gcc" and ".".join(map(str, found.compiler_version)) == gcc
    cmake = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout if shutil.which("cmake") else ""
    assert ".".join(map(str, found.cmake_version)) == (re.search(r"[\d.]+", cmake).group(0) if cmake else "")
    text = hb.explain(hb.BuildSpec(), found)
    assert text.startswith(f"toolchain: {found.describe()}")
    assert all(w.name in text and w.fixes in text for w in wa.WORKAROUNDS)


def test_nvcc_from_pip_finds_cudas_libraries_in_the_wheels_lib_folder(tmp_path):
    """pip's CUDA wheels put libcudart_static.a and libcudadevrt.a in nvidia/cu13/lib; nvcc.profile links
    from lib64: the GPU image's first build failed on `cannot find -lcudadevrt` before this."""
    wheel = tmp_path / "nvidia" / "cu13"
    (wheel / "bin").mkdir(parents=True)
    (wheel / "lib").mkdir()
    (wheel / "lib" / "libcudart.so.13").write_bytes(b"")
    (wheel / "include" / "cccl").mkdir(parents=True)
    gpu = hb.BuildSpec(frameworks=("torch",), gpu=True)
    env, applied = _applied(tmp_path, spec=gpu, nvcc=str(wheel / "bin" / "nvcc"), cuda_home=str(wheel))
    assert "nvcc-from-pip" in applied and env["HOROVOD_CUDA_HOME"] == env["CUDA_HOME"] == str(wheel)
    assert env["NVCC_APPEND_FLAGS"] == f"-L{wheel}/lib" and env["PATH"].startswith(f"{wheel}/bin")
    assert f"-isystem {wheel}/include/cccl" in env["CXXFLAGS"]
    link = Path(env["CMAKE_LIBRARY_PATH"]) / "libcudart.so"
    assert link.is_symlink() and link.resolve() == (wheel / "lib" / "libcudart.so.13").resolve()
    (wheel / "lib64").mkdir()
    assert "NVCC_APPEND_FLAGS" not in _applied(tmp_path, spec=gpu, cuda_home=str(wheel))[0], "a system CUDA: as it is"
