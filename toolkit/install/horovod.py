"""Build Horovod 0.28.1 from its sdist against today's frameworks, and cache the wheel.

The stock build fails on today's frameworks (torch >= 2.1, TensorFlow >= 2.19) and toolchains (GCC
>= 13, CMake >= 4, NCCL and CUDA's compiler from pip wheels). Every workaround is one row of
WORKAROUNDS (toolkit/install/workarounds.py), with the error it fixes and when it applies, judged from
the detected toolchain (toolkit/install/toolchain.py); `toolkit build-horovod --explain` prints the
table for this machine. This module: the request and its cache key, the build, the install, the checks.
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
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.install import buildlog, cachedir, pins, support, venvcache, wheelhouse
from toolkit.install import toolchain as toolchain_mod
from toolkit.install.buildspec import ALL_FRAMEWORKS, BuildSpec
from toolkit.install.workarounds import WORKAROUNDS, Build, pip

_HOROVOD_FLAG = {"torch": "PYTORCH", "tensorflow": "TENSORFLOW", "mxnet": "MXNET"}
MARKER = ".toolkit_build_key"
BUILD_INFO = ".toolkit_build.json"      # the installed build's manifest (wheelhouse.manifest)


def framework_versions(frameworks) -> dict[str, str]:
    """Installed distribution versions, read from metadata (no framework import)."""
    found = {}
    for fw in frameworks:
        for dist in support.DISTRIBUTIONS[fw]:
            try:
                found[fw] = f"{dist}=={metadata.version(dist)}"
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            raise ToolkitError(f"build-horovod: {fw} is not installed in {sys.prefix}; install it "
                               f"({support.install_fix(pins.HOROVOD_FRAMEWORKS[fw][0])}) or drop it from --frameworks")
    return found


def cache_key(spec: BuildSpec, versions: dict[str, str]) -> str:
    """Readable and unique: Horovod, Python, every framework version, the operations, the workarounds
    that change the built code (in_key: their names, and a hash of their edits, so that a changed patch
    set is a new key and a new build, never a cached wheel without it), extra flags."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    fws = "-".join(versions[f].replace("==", "") for f in sorted(versions))
    ops = spec.operations
    ctl = "+".join(spec.controllers)
    extra = hashlib.sha256("\n".join(spec.extra_env).encode()).hexdigest()[:8] if spec.extra_env else ""
    return "_".join(p for p in (f"horovod{pins.HOROVOD}", py, fws, ops, ctl, patches_key(spec), extra) if p)


def patches_key(spec: BuildSpec) -> str:
    """The cache key's part for the rows that change the built code: their names and a hash of their
    edits ("" when none applies)."""
    # no toolchain: a row in the key decides from the spec alone
    rows = [w for w in WORKAROUNDS if w.in_key and w.applies(Build(spec, None, Path(), {}))]  # type: ignore[arg-type]
    if not rows:
        return ""
    digest = hashlib.sha256(repr([(w.name, w.edits) for w in rows]).encode()).hexdigest()[:8]
    return "+".join(w.name for w in rows) + "-" + digest


def cache_dir() -> Path:
    return cachedir.home() / "horovod"


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
            w.run(build)
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


def _install(wheel: Path, key: str, data: dict | None = None) -> None:
    pip("install", "--no-deps", "--force-reinstall", "--no-compile", str(wheel))
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("horovod")
    package = Path(list(spec.submodule_search_locations)[0])   # type: ignore[union-attr,arg-type]  # just installed
    venvcache.replace_text(package / MARKER, key + "\n")      # a new file: a linked virtualenv keeps its own
    if data is not None:
        venvcache.replace_text(package / BUILD_INFO, json.dumps(data, indent=1) + "\n")


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


def ensure_requirements(spec: BuildSpec, say=print) -> None:
    """What Horovod imports at run time and what its build needs in this environment (support.HOROVOD_RUNTIME,
    HOROVOD_BUILD), installed at the pinned versions where missing (installed ones are left as they are);
    for MXNet the `numpy.bool` shim `make setup` installs too (lazy: it patches numpy only when mxnet is
    imported, and only where numpy lacks `bool`)."""
    if importlib.util.find_spec("pip") is None:
        raise ToolkitError(f"build-horovod: {sys.prefix} has no pip, which Horovod's build runs through; add it "
                           "(`uv pip install pip`, or make the environment with `uv venv --seed`)")
    absent = support.missing(support.HOROVOD_RUNTIME + support.HOROVOD_BUILD)
    if absent:
        say(f"horovod: installing what Horovod needs here: {' '.join(support.pinned(*absent))}")
        pip("install", "--disable-pip-version-check", "-q", *support.pinned(*absent))
        importlib.invalidate_caches()
    if "mxnet" in spec.frameworks:
        import sysconfig

        from toolkit.install import envsetup

        site = Path(sysconfig.get_paths()["purelib"])
        if not (site / "toolkit_numpy_compat.pth").exists():
            say(f"horovod: MXNet 1.9.1 uses numpy.bool (gone from numpy 1.24): the shim "
                f"toolkit_numpy_compat.pth installed in {site}")
            envsetup.install_numpy_shim(site)


def build_and_install(spec: BuildSpec, force: bool = False, sdist: str | None = None, say=print,
                      export: str | None = None, wheel_dir: str | None = None) -> Path:
    """Install Horovod for `spec`: from `wheel_dir` (a wheelhouse: no compiling), or from the cache when
    it holds this key, else build, verify, cache. `export`: copy the wheel and its manifest there."""
    versions = framework_versions(spec.frameworks)
    for fw in spec.frameworks:
        if note := support.outside(fw, versions[fw].split("==")[1]):
            say(f"horovod: {note}; building anyway")
    if note := support.python_outside():
        say(f"horovod: {note}; building anyway")
    ensure_requirements(spec, say)
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
        pip("download", "--no-deps", "--no-binary", "horovod", "--disable-pip-version-check", "-q",
             "-d", str(work / "sdist"), f"horovod=={pins.HOROVOD}")
        sdist = str(next((work / "sdist").glob("horovod-*.tar.gz")))
    if not Path(sdist).is_file():
        raise ToolkitError(f"--sdist {sdist}: no such file; give horovod-{pins.HOROVOD}.tar.gz")
    with tarfile.open(sdist) as tar:     # the "data" filter where this Python has it (3.11.4+)
        tar.extractall(work / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # type: ignore[arg-type]  # filter=
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
        f"({'NCCL' if spec.gpu else 'CPU'} ops); log: {log_path} (8-20 min on 2 cores; its progress follows)")
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
                with buildlog.Progress(log_path, say) as progress:
                    pip("wheel", "--no-build-isolation", "--no-deps", "--no-binary", "horovod", "--no-cache-dir",
                        "-v", "-w", str(work / "dist"), target, env=env, log=log)
            except ToolkitError as e:
                raise ToolkitError(f"{e}; {first_errors(log_path)}") from None
            say(f"horovod: compiled in {progress.took()}")
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
