"""One Horovod build for every node: `toolkit build-horovod --export DIR` writes the wheel and a manifest
of what it was built against into DIR/<key>/; `toolkit setup --wheelhouse DIR` (build-horovod
--wheelhouse DIR) installs the one whose key is this environment's, on a node without compilers, and
refuses anything else in one line naming what differs. Stdlib only.

The key (horovod_build.cache_key) already holds Horovod, Python, every framework's version, the
operations (CPU or NCCL), the controllers and the source patches (their rows' names and a hash of
their edits: a wheel exported by a toolkit with other patches is refused); the manifest adds what the
key cannot show and a node must still have: the C library, MPI, the NCCL a pip-NCCL build loads at
run time.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.install import pins
from toolkit.run.checkpoint import sha256

MANIFEST = "manifest.json"
FORMAT = 1


def mpi_version() -> str | None:
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout.splitlines()
    return out[0].strip() if out else "unknown"


def manifest(spec, versions: dict[str, str], key: str, wheel: Path, toolchain=None,
             workarounds: list[str] | None = None) -> dict:
    """What `wheel` was built against (spec: horovod_build.BuildSpec; toolchain: the detected one, or
    None for a wheel cached before manifests were written)."""
    nccl = toolchain.nccl if (toolchain is not None and spec.gpu) else None
    return {
        "format": FORMAT, "key": key, "horovod": pins.HOROVOD, "wheel": wheel.name, "sha256": sha256(wheel),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}", "platform": sysconfig.get_platform(),
        "glibc": platform.libc_ver()[1] or None,
        "frameworks": {fw: versions[fw] for fw in sorted(versions)},
        "operations": spec.operations,
        "controllers": spec.controllers,
        "mpi": mpi_version() if spec.mpi else None,
        "nccl": None if nccl is None else {"source": nccl.source, "version": nccl.version},
        "toolchain": toolchain.describe() if toolchain is not None else "not recorded",
        "workarounds": list(workarounds or []),
        "built": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def write_manifest(folder: Path, data: dict) -> None:
    tmp = folder / (MANIFEST + ".partial")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, folder / MANIFEST)


def export(wheel: Path, data: dict, directory: str) -> Path:
    """Copy `wheel` and its manifest into DIR/<key>/ (other builds in DIR stay)."""
    folder = Path(directory) / data["key"]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / (wheel.name + ".partial")
        shutil.copyfile(wheel, partial)
        os.replace(partial, folder / wheel.name)
        write_manifest(folder, data)
    except OSError as e:
        raise ToolkitError(f"--export {directory}: cannot write there ({e.strerror or e}); give a writable folder") \
            from None
    return folder


def manifests(directory: str) -> list[dict]:
    root = Path(directory)
    if not root.is_dir():
        raise ToolkitError(f"--wheelhouse {directory}: no such folder; export one with "
                           f"`toolkit build-horovod --export {directory}` on a machine that builds")
    found = []
    for path in sorted(root.glob(f"*/{MANIFEST}")):
        try:
            data = json.loads(path.read_text())
            data["_folder"] = str(path.parent)
            found.append(data)
        except (OSError, ValueError):
            continue
    if not found:
        raise ToolkitError(f"--wheelhouse {directory}: no {MANIFEST} in its folders; export into it with "
                           f"`toolkit build-horovod --export {directory}`")
    return found


def differences(data: dict, key: str, versions: dict[str, str], spec) -> list[str]:
    """What keeps this build off this environment, in words, most telling first."""
    out = []
    here_py = f"{sys.version_info.major}.{sys.version_info.minor}"
    if data.get("python") != here_py:
        out.append(f"Python {data.get('python')} (this is {here_py})")
    if data.get("horovod") != pins.HOROVOD:
        out.append(f"Horovod {data.get('horovod')} (the toolkit pins {pins.HOROVOD})")
    theirs = data.get("frameworks", {})
    if sorted(theirs) != sorted(versions):
        out.append(f"frameworks {', '.join(sorted(theirs))} (this asks for {', '.join(sorted(versions))}: "
                   f"pass --frameworks {','.join(sorted(theirs))})")
    for fw in sorted(set(theirs) & set(versions)):
        if theirs[fw] != versions[fw]:
            out.append(f"{theirs[fw]} (this environment has {versions[fw]})")
    if data.get("operations") != spec.operations:
        out.append(f"{'NCCL (GPU)' if data.get('operations') == 'nccl' else 'CPU'} operations "
                   f"(this asks for {'NCCL: --gpus' if spec.gpu else 'CPU'})")
    if data.get("controllers") != spec.controllers:
        out.append(f"controllers {'+'.join(data.get('controllers', []))} (this asks for {'+'.join(spec.controllers)})")
    if not out and data.get("key") != key:
        out.append(f"other build options or source patches ({data.get('key')} vs {key})")
    return out


def runtime_problems(data: dict) -> list[str]:
    """What this node lacks to run a build that matches: an older C library, no MPI, another pip NCCL."""
    out = []
    theirs, mine = data.get("glibc"), platform.libc_ver()[1]
    if theirs and mine and tuple(map(int, mine.split("."))) < tuple(map(int, theirs.split("."))):
        out.append(f"glibc {mine} here, the wheel was built on glibc {theirs}: build on the oldest node's OS")
    if "mpi" in data.get("controllers", []) and not shutil.which("mpirun"):
        out.append(f"built with MPI but mpirun is missing: apt-get install {' '.join(pins.APT_RUNTIME)}")
    nccl = data.get("nccl")
    if nccl and nccl.get("source", "system") != "system":
        try:
            have = metadata.version(nccl["source"])
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not have.startswith(nccl["version"]):
            out.append(f"linked against {nccl['source']} {nccl['version']} (NCCL from pip), this environment has "
                       f"{have or 'none'}: install {nccl['source']}=={nccl['version']}.*")
    return out


def find(directory: str, key: str, versions: dict[str, str], spec) -> tuple[Path, dict]:
    """The wheel in DIR built for `key`, checked (sha256, this node's C library, MPI, NCCL); else a
    one-line ToolkitError naming what differs in the closest build there."""
    found = manifests(directory)
    match = next((m for m in found if m.get("key") == key), None)
    if match is None:
        closest = min(found, key=lambda m: len(differences(m, key, versions, spec)))
        why = "; ".join(differences(closest, key, versions, spec))
        raise ToolkitError(f"--wheelhouse {directory}: no Horovod build for this environment; the closest "
                           f"({Path(closest['_folder']).name}) was built for {why}. Export one from a machine with "
                           f"these versions (`toolkit build-horovod --export DIR`) or build here (drop --wheelhouse)")
    wheel = Path(match["_folder"]) / match["wheel"]
    if not wheel.is_file() or sha256(wheel) != match.get("sha256"):
        raise ToolkitError(f"--wheelhouse {directory}: {wheel} is missing or does not match its sha256 in "
                           f"{MANIFEST}; export it again")
    problems = runtime_problems(match)
    if problems:
        raise ToolkitError(f"--wheelhouse {directory}: {wheel.name} ({Path(match['_folder']).name}) cannot run "
                           f"here: {'; '.join(problems)}")
    return wheel, match
