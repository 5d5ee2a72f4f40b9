"""The toolkit installed into an environment a user already has, not the repository's `.venv`.

The long test is the first row of the support table (toolkit/install/support.py, docs/INSTALL.md): a fresh
virtualenv with the CPU-only torch 2.13.0 wheel, `pip install` of the wheel `python -m build` made,
`toolkit build-horovod` (what it finds; Horovod's run-time requirements installed where missing),
`toolkit doctor --framework torch` ready, and 2 ranks of examples/your_torch.py under plain horovodrun,
from a folder outside the checkout. The rest of the rows: `make support` (not in the suite: a Horovod
build per row).
"""
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import toolkit
from toolkit.install import pins, support

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def test_the_distribution_is_named_apart_and_its_requirements_are_horovods_and_admit_the_pins():
    """`toolkit` on the index is someone else's; the dependencies are Horovod's run-time requirements (what
    build-horovod installs when missing) plus the toolkit's own, as ranges that admit pins.py's versions; the
    frameworks are extras only (a user's torch is never replaced by installing the toolkit)."""
    from packaging.requirements import Requirement

    assert PYPROJECT["name"] == support.DISTRIBUTION == "horovod-toolkit"
    assert {_name(r) for r in PYPROJECT["dependencies"]} == set(support.HOROVOD_RUNTIME)
    every = {**pins.FRAMEWORKS, **pins.NO_DEPS, **pins.TOOLS}
    for group, requirements in {"": PYPROJECT["dependencies"], **PYPROJECT["optional-dependencies"]}.items():
        for text in requirements:
            req = Requirement(text)
            if req.name in every:
                assert req.specifier.contains(every[req.name]), (group, text, every[req.name])
    frameworks = {"torch", "torchvision", "tensorflow", "tensorflow-cpu", "tf-keras", "mxnet"}
    assert not frameworks & {_name(r) for r in PYPROJECT["dependencies"]}
    assert {"torch", "tensorflow", "mxnet", "mpi", "test"} <= set(PYPROJECT["optional-dependencies"])


def test_version_and_changelog_agree():
    out = subprocess.run([sys.executable, "-m", "toolkit", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"horovod-toolkit {toolkit.__version__} "), out
    first = re.search(r"^## \[?(\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert first and first.group(1) == toolkit.__version__, "CHANGELOG.md's newest entry is this version"
    # a wheel's file name in the user pages: this version's, or a glob (a copied command then works)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for named in re.findall(r"horovod_toolkit-([^-\s/]+)-py3", page.read_text()):
            assert named in (toolkit.__version__, "*"), f"{page.name} names horovod_toolkit-{named}"


def test_fixes_name_make_setup_only_in_a_checkout(monkeypatch, tmp_path):
    assert support.in_checkout()
    assert support.fix("toolkit build-horovod") == "`toolkit build-horovod` (or `make setup`)"
    monkeypatch.setattr(support, "CHECKOUT", tmp_path)         # an installed wheel: no Makefile beside it
    assert support.fix("toolkit build-horovod") == "`toolkit build-horovod`"
    assert "make setup" not in support.install_fix("mpi4py") and "-m pip install mpi4py" in support.install_fix("mpi4py")
    assert not support.source_tree()
    # The Docker images copy pyproject.toml, README.md, toolkit/ and adapters/ (no Makefile) and run `toolkit
    # setup` there: a source tree setup installs from, where `make setup` is no fix.
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "adapters").mkdir()
    assert support.source_tree() and not support.in_checkout()


def test_a_version_outside_the_table_is_one_line_and_the_local_label_is_ignored():
    assert support.outside("torch", "2.13.0+cpu") == ""
    assert support.outside("torch", "2.9.0") == \
        "torch 2.9.0 is outside the tested versions (2.13.0, 2.14.1; docs/INSTALL.md)"


def test_build_horovod_with_no_framework_installed_is_one_line(monkeypatch, capsys):
    from toolkit import cli

    monkeypatch.setattr(support, "found", lambda: {})
    assert cli.main(["build-horovod"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "build-horovod: no framework installed" in err[0] and "--frameworks" in err[0], err


def test_setup_outside_a_checkout_is_one_line(monkeypatch, capsys, tmp_path):
    from toolkit import cli

    monkeypatch.setattr(support, "CHECKOUT", tmp_path)
    assert cli.main(["setup", "--venv", str(tmp_path / "venv")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "build-horovod" in err[0] and "docs/INSTALL.md" in err[0], err
    assert not (tmp_path / "venv").exists()


@pytest.mark.distributed
def test_a_fresh_virtualenv_with_the_cpu_torch_2_13_wheel_installs_builds_horovod_and_trains(tmp_path):
    from benchmarks import support_matrix as matrix

    row = support.SUPPORT[0]
    assert (row.framework, row.version, row.python) == ("torch", "2.13.0", "3.11")
    # The package: a wheel and an sdist twine passes, the import package `toolkit` with its adapters, no
    # repository files (tests, examples, the Makefile), Horovod's run-time requirements declared.
    wheel, sdist = matrix.build_dist(tmp_path / "dist")
    assert wheel.name == f"horovod_toolkit-{toolkit.__version__}-py3-none-any.whl", wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "toolkit/adapters/torch/session.py" in names and "toolkit/shims/toolkit_numpy_compat.py" in names
    assert not [n for n in names if n.startswith(("tests/", "examples/", "benchmarks/")) or n == "Makefile"], names
    requires = {_name(ln.split(":", 1)[1].strip()) for ln in meta.splitlines() if ln.startswith("Requires-Dist:")
                and "extra ==" not in ln}
    assert requires == set(support.HOROVOD_RUNTIME), meta
    # Apache-2.0, Horovod's licence, with the notice on the Horovod builds it patches
    assert "License: Apache-2.0" in meta.splitlines(), meta
    assert {n.rsplit("/", 1)[-1] for n in names if "/licenses/" in n} == {"LICENSE", "NOTICE"}, names

    venv = tmp_path / "venv"
    matrix.make_env(row, wheel, venv)
    versions = subprocess.run([venv / "bin" / "python", "-c", "import torch, toolkit; print(torch.__version__, "
                               "toolkit.__file__)"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                              env=matrix.clean_env(venv)).stdout.split()
    assert versions[0] == "2.13.0+cpu" and versions[1].startswith(str(venv)), versions
    assert matrix.toolkit(venv, "--version").stdout.startswith(f"horovod-toolkit {toolkit.__version__} ")
    # What another installer (or `pip install --no-deps`) leaves out, build-horovod installs before building:
    # the failure this issue started from (`No module named 'psutil'` once the build was done).
    subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", "psutil", "cloudpickle"],
                   check=True, capture_output=True, timeout=120)
    built = matrix.toolkit(venv, "build-horovod", timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "horovod: frameworks found here: torch 2.13.0+cpu" in built.stdout, built.stdout
    assert (f"installing what Horovod needs here: cloudpickle=={pins.TOOLS['cloudpickle']} "
            f"psutil=={pins.TOOLS['psutil']}") in built.stdout, built.stdout

    doctor = matrix.toolkit(venv, "doctor", "--framework", "torch")
    assert doctor.returncode == 0 and doctor.stdout.rstrip().endswith("ready: torch"), doctor.stdout
    assert re.search(r"^ok +torch +2\.13\.0\+cpu \(in the support table", doctor.stdout, re.M), doctor.stdout
    assert not re.search(r"tensorflow|mxnet|make setup", doctor.stdout), doctor.stdout   # only what was asked

    result = matrix.job(venv, "torch")           # horovodrun -np 2 --gloo python examples/your_torch.py
    assert result["world_size"] == 2 and len(set(result["final_digests"])) == 1, result
    assert result["accuracy"] > 0.9, result
    # The launcher and the built-in script come from the wheel too (nothing read from the checkout).
    launched = matrix.toolkit(venv, "launch", "-np", "2", "--gloo", "--timeout", "300", "--", "toolkit", "train",
                              "--framework", "torch", "--dataset", "digits", "--epochs", "1", "--quiet")
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-2000:]


def test_uv_installs_the_wheel_and_its_commands_run(tmp_path):
    """docs/INSTALL.md's uv path: `uv venv --seed` (pip inside, which build-horovod needs), `uv pip install` of
    the wheel; the command runs from it, and doctor's fix for the missing framework is a pip command."""
    from benchmarks import support_matrix as matrix

    uv = Path(sys.executable).parent / "uv"
    wheel, _ = matrix.build_dist(tmp_path / "dist", check=False)
    venv = tmp_path / "uv-venv"
    for cmd in ([uv, "venv", "-q", "--seed", "--python", sys.executable, venv],
                [uv, "pip", "install", "-q", "--python", venv / "bin" / "python", wheel]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=matrix.clean_env())
        assert proc.returncode == 0, proc.stderr
    assert matrix.toolkit(venv, "--version").stdout.startswith(f"horovod-toolkit {toolkit.__version__} ")
    doctor = matrix.toolkit(venv, "doctor", "--framework", "mxnet", timeout=300)
    assert doctor.returncode == 1 and "NOT READY: mxnet" in doctor.stdout, doctor.stdout
    assert re.search(r"^FAIL +mxnet +not installed\n +fix: `python3?\S* -m pip install mxnet==1\.9\.1 numpy==1\.26\.4`$",
                     doctor.stdout, re.M), doctor.stdout
    assert "make setup" not in doctor.stdout
