"""The Horovod build recipe: switches, workarounds and the cache key (no compiling here)."""
import dataclasses
import os
import re
from pathlib import Path

import pytest

from toolkit.errors import ToolkitError
from toolkit.install import horovod as hb
from toolkit.install import horovod_patches as hp
from toolkit.install import toolchain as tc
from toolkit.install import workarounds as wa

# This machine's kind of toolchain (Debian 12), written out: the tests below change one thing at a time.
TOOLCHAIN = tc.Toolchain(python=(3, 11), compiler="c++", compiler_id="gcc", compiler_version=(12, 2, 0),
                         cmake_version=(3, 25, 1), cffi=True)


def _stand_in(root, rows=wa.WORKAROUNDS):
    """A source tree holding what the rows' edits expect to find (each `old`, or a regex's example, as
    many times as Horovod's files have it)."""
    files = {}
    for w in rows:
        for e in w.edits:
            files.setdefault(e.path, []).extend([e.example or e.old] * e.count)
    for path, parts in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("\n".join(parts) + "\n")
    return root


def test_env_has_the_workarounds(tmp_path):
    source = _stand_in(tmp_path / "src")
    env, applied = hb.build_env(hb.BuildSpec(), tmp_path, {"CXXFLAGS": "-O2", "HOROVOD_WITHOUT_MXNET": "1"},
                                TOOLCHAIN, source=source)
    assert applied == ["cxx-std", "torch-cpu-no-cuda-home", "tensorflow-headers", "mxnet-enqueue-name", "keras3-api",
                       "launcher-no-framework"]
    assert (source / hp.OPERATIONS_CC).read_text().count("<< enqueued_name;") == 3
    assert "_ref(var)" in (source / "horovod/_keras/__init__.py").read_text()
    assert "_recorded_build('gloo_built', verbose)" in (source / "horovod/common/util.py").read_text()
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
    # the patches that change the built code are in the key, by name and by content: a wheel cached
    # without them (or with other edits) is not reused, a clean clone's `make setup` builds anew
    assert re.search(r"_mxnet-enqueue-name\+keras3-api\+launcher-no-framework-[0-9a-f]{8}$", base), base
    torch_only = hb.cache_key(hb.BuildSpec(frameworks=("torch",)), {"torch": versions["torch"]})
    assert "enqueue" not in torch_only and "keras3" not in torch_only and "launcher-no-framework" in torch_only


def test_a_changed_patch_gives_a_new_cache_key(monkeypatch):
    versions = {"tensorflow": "tensorflow-cpu==2.21.0"}
    spec = hb.BuildSpec(frameworks=("tensorflow",))
    before = hb.cache_key(spec, versions)
    row = next(w for w in wa.WORKAROUNDS if w.name == "keras3-api")
    edits = row.edits[:-1] + (dataclasses.replace(row.edits[-1], new=row.edits[-1].new + " "),)
    monkeypatch.setattr(hb, "WORKAROUNDS", tuple(dataclasses.replace(w, edits=edits) if w is row else w
                                                 for w in wa.WORKAROUNDS))
    after = hb.cache_key(spec, versions)
    assert after != before and after.rsplit("-", 1)[0] == before.rsplit("-", 1)[0]


def test_a_wheelhouse_build_made_with_other_patches_is_refused(tmp_path):
    import json
    import sys

    from toolkit.install import pins, wheelhouse
    spec, versions = hb.BuildSpec(frameworks=("torch",)), {"torch": "torch==2.14.1"}
    key = hb.cache_key(spec, versions)
    theirs = key.rsplit("-", 1)[0] + "-00000000"          # the same rows, other edits
    (tmp_path / theirs).mkdir()
    (tmp_path / theirs / wheelhouse.MANIFEST).write_text(json.dumps({
        "key": theirs, "horovod": pins.HOROVOD, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "frameworks": versions, "operations": "cpu", "controllers": ["mpi", "gloo"], "wheel": "horovod.whl"}))
    with pytest.raises(ToolkitError, match=re.escape(f"built for other build options or source patches ({theirs} vs {key})")):
        wheelhouse.find(str(tmp_path), key, versions, spec)


def test_the_installed_horovod_carries_todays_patches():
    """The installed build was made with the patches in this checkout (its key holds their hash): else
    the tests of what they fix would test an older Horovod; `make setup` rebuilds on a new key."""
    key, data = hb.installed_key(), hb.installed_build()
    if key is None or data is None:
        pytest.skip("no Horovod built by the toolkit here; run `make setup`")
    spec = hb.BuildSpec(frameworks=tuple(sorted(data["frameworks"])), gpu=data["operations"] == "nccl",
                        mpi="mpi" in data["controllers"], gloo="gloo" in data["controllers"])
    assert hb.patches_key(spec) in key.split("_"), f"the installed Horovod ({key}) has other patches: run `make setup`"


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
    header = _stand_in(tmp_path / "src") / hp.FLATBUFFERS_SPAN
    env, applied = hb.build_env(hb.BuildSpec(frameworks=("torch",)), tmp_path, {},
                                dataclasses.replace(TOOLCHAIN, compiler_id=compiler_id, compiler_version=version),
                                source=tmp_path / "src")
    assert ("gcc13-includes" in applied) == includes
    assert ("-include string -include stdexcept" in env.get("CXXFLAGS", "")) == includes
    assert ("gcc14-flatbuffers" in applied) == patch
    assert ("  size_type count_;" in header.read_text().splitlines()) == patch


def test_the_source_patches_match_horovods_own_files(tmp_path):
    """The patched lines are in Horovod 0.28.1's sdist (pip's download; skipped without an index):
    flatbuffers' span, the three ops that log their name after queueing it (MXNet frees it), the Keras 3
    API, the controllers recorded for horovodrun; each patched Python file still compiles."""
    proc = __import__("subprocess").run([__import__("sys").executable, "-m", "pip", "download", "--no-deps",
                                         "--no-binary", "horovod", "-q", "-d", str(tmp_path), "horovod==0.28.1"],
                                        capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip("no package index to download Horovod's sdist from")
    source = hb._unpack(str(next(tmp_path.glob("horovod-*.tar.gz"))), tmp_path / "work")
    build = wa.Build(hb.BuildSpec(), TOOLCHAIN, tmp_path, {}, source)
    rows = [w for w in wa.WORKAROUNDS if w.edits]
    assert {w.name for w in rows} == {"gcc14-flatbuffers", "mxnet-enqueue-name", "keras3-api", "launcher-no-framework"}
    for w in rows:
        w.run(build)
    assert "  size_type count_;" in (source / hp.FLATBUFFERS_SPAN).read_text().splitlines()
    ops = (source / hp.OPERATIONS_CC).read_text()
    assert ops.count('<< "Enqueued " << enqueued_name;') == 3 and '<< "Enqueued " << name;' not in ops
    for path in sorted({e.path for w in rows for e in w.edits if e.path.endswith(".py")}):
        compile((source / path).read_text(), path, "exec")
        assert ".ref()" not in re.sub(r"\)\.ref\(\)", "", (source / path).read_text()), path
    assert '"${_toolkit_name}_built\\": true' in (source / "CMakeLists.txt").read_text()
    for w in rows:                              # applied twice (or another Horovod): refused, not half-done
        util = (source / "horovod/common/util.py").read_text()
        with pytest.raises(ToolkitError, match=f"{w.name}: .* is not the file it patches"):
            w.run(build)
        assert (source / "horovod/common/util.py").read_text() == util


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
