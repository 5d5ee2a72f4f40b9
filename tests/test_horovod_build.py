"""The Horovod build recipe: switches, workarounds and the cache key (no compiling here)."""
import os

import pytest

from toolkit import horovod_build as hb
from toolkit.errors import ToolkitError


def test_env_has_the_workarounds(tmp_path):
    env = hb.build_env(hb.BuildSpec(), tmp_path, {"CXXFLAGS": "-O2", "HOROVOD_WITHOUT_MXNET": "1"})
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
    env = hb.build_env(hb.BuildSpec(frameworks=("torch",), gpu=True, mpi=False, extra_env=("HOROVOD_DEBUG=1",)),
                       tmp_path, {})
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_WITHOUT_TENSORFLOW"] == env["HOROVOD_WITHOUT_MXNET"] == env["HOROVOD_WITHOUT_MPI"] == "1"
    assert env["HOROVOD_DEBUG"] == "1"
    assert "xla_shim" not in env["CXXFLAGS"]


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


@pytest.mark.parametrize("kwargs, needle", [
    (dict(frameworks=("jax",)), "unknown jax"),
    (dict(frameworks=()), "at least one"),
    (dict(mpi=False, gloo=False), "no controller"),
    (dict(extra_env=("NOEQUALS",)), "KEY=VALUE"),
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
    env = hb.build_env(hb.BuildSpec(frameworks=("torch",)), tmp_path, dict(os.environ))
    probe = "from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "None", out
    assert "PYTHONPATH" not in hb.build_env(hb.BuildSpec(frameworks=("torch",), gpu=True), tmp_path, {})
