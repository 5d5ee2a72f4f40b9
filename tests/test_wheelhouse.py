"""One Horovod build for every node (issue 20): `build-horovod --export DIR` writes the cached wheel and a
manifest; `--wheelhouse DIR` installs it in a fresh environment without building, and it trains there;
a build for other versions, or a damaged wheel, is refused in one line with nothing installed."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TRAIN, clean_env, one_line_error, run, summary
from toolkit.install import horovod as horovod_build
from toolkit.install import pins, wheelhouse

pytestmark = pytest.mark.skipif(horovod_build.installed_key() is None,
                                reason="no toolkit-built Horovod installed (run `make setup`)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """This environment's build, exported (from the wheel cache: no compiling)."""
    directory = tmp_path_factory.mktemp("wheelhouse")
    proc = run([sys.executable, "-m", "toolkit", "build-horovod", "--export", directory], timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exported" in proc.stdout, proc.stdout
    return directory


def test_export_writes_the_wheel_and_what_it_was_built_against(exported):
    key = horovod_build.installed_key()
    folder = exported / key
    data = json.loads((folder / wheelhouse.MANIFEST).read_text())
    wheel = folder / data["wheel"]
    assert data["key"] == key and data["horovod"] == pins.HOROVOD and wheel.is_file()
    assert data["sha256"] == wheelhouse.sha256(wheel)
    assert data["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert data["frameworks"] == horovod_build.framework_versions(sorted(data["frameworks"]))
    assert data["operations"] == "cpu" and data["controllers"] == ["mpi", "gloo"]
    assert data["mpi"].startswith("mpirun (Open MPI)") and data["glibc"]


def _one_line(*args, env=None):
    proc = run([sys.executable, "-m", "toolkit", "build-horovod", *args], timeout=300, env=env)
    return proc


def test_a_build_for_other_versions_or_a_damaged_wheel_is_refused_in_one_line(exported, tmp_path):
    import shutil
    key = horovod_build.installed_key()
    before = horovod_build.installed_build()
    other = tmp_path / "other"
    shutil.copytree(exported, other)
    manifest = other / key / wheelhouse.MANIFEST
    data = json.loads(manifest.read_text())
    torch = data["frameworks"]["torch"]
    data["frameworks"]["torch"] = "torch==2.13.0+cpu"
    data["key"] = key.replace(torch.replace("==", ""), "torch2.13.0+cpu")
    manifest.write_text(json.dumps(data))
    proc = _one_line("--wheelhouse", other)
    one_line_error(proc, f"--wheelhouse {other}: no Horovod build for this environment",
                   f"torch==2.13.0+cpu (this environment has {torch})")
    (other / key / wheelhouse.MANIFEST).unlink()
    shutil.copytree(exported / key, other / key, dirs_exist_ok=True)
    wheel = other / key / data["wheel"]
    wheel.write_bytes(wheel.read_bytes()[:-10])
    one_line_error(_one_line("--wheelhouse", other), "does not match its sha256")
    one_line_error(_one_line("--wheelhouse", tmp_path / "missing"), "no such folder", "--export")
    one_line_error(_one_line("--wheelhouse", exported, "--frameworks", "torch"),
                   "pass --frameworks " + ",".join(sorted(data["frameworks"])))
    assert horovod_build.installed_build() == before, "a refused wheelhouse must install nothing"


def _fresh_environment(tmp_path) -> Path:
    """A new virtualenv that sees this one's frameworks (each top-level entry of its site-packages,
    linked) but not its Horovod: what a node has after `toolkit setup` installed the pins."""
    import sysconfig
    fresh = tmp_path / "fresh"
    subprocess.run([sys._base_executable, "-m", "venv", str(fresh)], check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    shared = tmp_path / "shared"
    shared.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith("horovod") and not entry.name.endswith(".pth"):
            (shared / entry.name).symlink_to(entry)
    fresh_site = next((fresh / "lib").glob("python3*/site-packages"))
    (fresh_site / "a_shared.pth").write_text(f"{shared}\n")
    for pth in site.glob("*.pth"):      # MXNet's numpy shim, the toolkit's editable install: after a_shared
        (fresh_site / f"z_{pth.name}").write_text(pth.read_text())
    return fresh


@pytest.mark.distributed
def test_an_exported_build_installs_without_compiling_in_a_fresh_environment_and_trains(exported, tmp_path):
    fresh = _fresh_environment(tmp_path)
    python = str(fresh / "bin" / "python")
    env = clean_env(TOOLKIT_CACHE_DIR=str(tmp_path / "empty-cache"),
                    PATH=f"{fresh / 'bin'}{os.pathsep}{os.environ['PATH']}")
    probe = [python, "-c", "import importlib.util as u; print(u.find_spec('horovod'))"]
    assert run(probe, env=env).stdout.strip() == "None", "the fresh environment must start without Horovod"
    proc = run([python, "-m", "toolkit", "build-horovod", "--wheelhouse", exported], env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "from the wheelhouse" in proc.stdout and "building" not in proc.stdout, proc.stdout
    where = run([python, "-c", "import horovod; print(horovod.__file__)"], env=env).stdout.strip()
    assert where.startswith(str(fresh)), where
    again = run([python, "-m", "toolkit", "build-horovod", "--wheelhouse", exported], env=env, timeout=300)
    assert "already installed" in again.stdout, again.stdout
    out = summary(run([python, "-m", "toolkit", "launch", "-np", "2", "--gloo", "--timeout", "200", "--", python,
                       *TRAIN[1:], "--framework", "torch", "--dataset", "digits", "--epochs", "2"],
                      env=env, timeout=240))
    assert out["world_size"] == 2 and out["accuracy"] > 0.7 and len(set(out["final_digests"])) == 1
