"""`toolkit setup`: the whole environment in one idempotent command.

System packages (Open MPI) -> `.venv/` -> pinned packages -> numpy shim for MXNet -> the engines asked
for (`--engines ray,spark`: their pins, and Java for Spark) -> Horovod (built once, then from the cache) ->
every Horovod extension imported to prove it.
Runs under the bare system Python (stdlib only) before the virtualenv exists.
"""
from __future__ import annotations

import collections
import ctypes.util
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.install import pins, venvcache

ROOT = Path(__file__).resolve().parents[2]       # the checkout: toolkit/install/envsetup.py
SHIM = Path(__file__).resolve().parents[1] / "shims" / "toolkit_numpy_compat.py"
STAMP = ".toolkit-pins"


def pins_digest(gpu: bool = False) -> str:
    """Changes whenever a pin, the CPU/GPU variant, or the way the shim works, changes."""
    text = "\n".join(pins.requirements(gpu) + pins.no_deps_requirements()) + SHIM.read_text()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_system_packages(say, compilers: bool = True) -> None:
    """Open MPI: mpirun, and mpicxx too unless Horovod comes built (`compilers` False: a wheelhouse,
    then pins.APT_RUNTIME: mpirun and the OpenMP runtime a compiler would have brought)."""
    if shutil.which("mpirun") and (shutil.which("mpicxx") if compilers
                                   else all(ctypes.util.find_library(lib) for lib in pins.RUNTIME_LIBRARIES)):
        return
    wanted = pins.APT_PACKAGES if compilers else pins.APT_RUNTIME
    packages = " ".join(wanted)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ToolkitError(f"Open MPI is missing: install it with `sudo apt-get install -y {packages}`, "
                           "then run `make setup` again")
    say(f"setup: apt-get install {packages}")
    _apt_get(wanted)


def _apt_get(packages) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
            raise ToolkitError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {last}; run it yourself to see "
                               "the whole output, then `toolkit setup` again")


def parse_engines(text: str | None) -> list[str]:
    """`--engines ray,spark` (or `all`) -> those engines in pins.ENGINES' order; None or empty: none."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if "all" in names:
        return list(pins.ENGINES)
    if unknown := [n for n in names if n not in pins.ENGINES]:
        raise ToolkitError(f"setup --engines {text}: unknown engine {unknown[0]!r}; choose from "
                           f"{', '.join(pins.ENGINES)} or all (comma-separated)")
    return [e for e in pins.ENGINES if e in names]


def java_path() -> str | None:
    """The `java` Spark starts: JAVA_HOME's when set (as pyspark does), else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_major(text: str) -> int | None:
    """The major version in `java -version`'s output (`"17.0.15"` -> 17, `"1.8.0_412"` -> 8), else None."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def java_version(java: str | None = None) -> int | None:
    """The major version of `java` (default: java_path()), None when there is none or it does not run."""
    java = java or java_path()
    if not java:
        return None
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return java_major(proc.stderr + proc.stdout)


def ensure_java(say, engines) -> None:
    """The Java `engines` need (pins.ENGINE_JAVA: Spark 4, 17+): when `java` is missing or older, Debian's
    pins.ENGINE_APT package with apt-get as root, else one line with the command."""
    need = max((pins.ENGINE_JAVA[e] for e in engines if e in pins.ENGINE_JAVA), default=None)
    if need is None:
        return
    have = java_version()
    if have is not None and have >= need:
        return
    found = f"Java {have} ({java_path()})" if have else "no Java"
    wanted = [p for e in engines for p in pins.ENGINE_APT.get(e, ())]
    packages = " ".join(wanted)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ToolkitError(f"Spark needs Java {need} or newer and this machine has {found}: install it with "
                           f"`sudo apt-get install -y {packages}`, then run `toolkit setup --engines "
                           f"{','.join(engines)}` again")
    say(f"setup: apt-get install {packages} (Spark needs Java {need} or newer; found {found})")
    _apt_get(wanted)
    if (have := java_version()) is None or have < need:
        raise ToolkitError(f"setup: {packages} is installed but `{java_path()}` is Java {have}: Spark needs "
                           f"{need} or newer (unset JAVA_HOME, or point it at Java {need})")


def stamped_engines(written: list[str]) -> list[str]:
    """The engines the stamp records as installed at their current pins (its third line: their `name==version`
    requirements); an engine whose pin changed since is not among them."""
    recorded = set(written[2].split(",")) if len(written) > 2 else set()
    return [e for e in pins.ENGINES if set(pins.engine_requirements([e])) <= recorded]


def _write_stamp(stamp: Path, gpu: bool, frameworks: list[str], engines: list[str]) -> None:
    venvcache.replace_text(stamp, f"{pins_digest(gpu)}\n{','.join(frameworks)}\n{','.join(pins.engine_requirements(engines))}\n")


def install_engines(python: Path, engines: list[str], gpu: bool, frameworks: list[str], say=None) -> None:
    """pip install of `engines`' pins, with every other pin as a constraint: their dependencies never move a
    framework or a tool that setup pinned."""
    pinned = pins.requirements(gpu, frameworks) + pins.no_deps_requirements(frameworks)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("".join(re.sub(r"\[.*?\]", "", r) + "\n" for r in pinned))   # constraints take no extras
        constraints.flush()
        _run([python, "-m", "pip", "install", "--disable-pip-version-check", "-c", constraints.name,
              *pins.engine_requirements(engines)], f"pip install of the {', '.join(engines)} engine pins", say)


def install_numpy_shim(site_packages: Path) -> None:
    """MXNet 1.9.1 uses `numpy.bool`, gone in numpy 1.24..1.26; a .pth restores it in every process."""
    venvcache.replace_text(site_packages / SHIM.name, SHIM.read_text())
    venvcache.replace_text(site_packages / "toolkit_numpy_compat.pth", "import toolkit_numpy_compat\n")


def default_venv() -> Path:
    """.venv for the pinned Python, .venv-X.Y for another (each Python its own virtualenv)."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return ROOT / (".venv" if py == pins.PYTHON else f".venv-{py}")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


PIP_FETCH = re.compile(r"^\s*(?:Downloading|Using cached) (\S+)(?: \(([^)]+)\))?\s*$")


def _run(cmd, what: str, say=None) -> None:
    """`cmd` (a pip install), its output kept for the error. With `say`: one line per package pip downloads
    or takes from its cache, with its size (pip's own output without -q), said as it comes; not under CI."""
    show = say is not None and not os.environ.get("CI")
    tail: collections.deque[str] = collections.deque(maxlen=15)
    with subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if show and (fetched := PIP_FETCH.match(line)):
                name, size = fetched.group(1).rsplit("/", 1)[-1], fetched.group(2)
                say(f"setup:   {name}" + (f" ({size})" if size else ""))   # type: ignore[misc]  # show: say given
    if proc.returncode != 0:
        raise ToolkitError(f"setup: {what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def framework_wheels(python: Path, frameworks, gpu: bool = False, version: str | None = None) -> dict[str, str | None]:
    """Each framework -> None when pip finds a wheel of every pinned distribution it needs
    (pins.FRAMEWORK_DISTRIBUTIONS) for the Python of `python` (or `version`, "X.Y", asked of pip as
    --python-version), else the first requirement without one. The index answers, not a table."""
    found: dict[str, str | None] = {}
    with tempfile.TemporaryDirectory() as nowhere:
        for fw in frameworks:
            found[fw] = None
            for req in pins.framework_requirements(fw, gpu):
                cmd = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--dry-run",
                       "--ignore-installed", "--no-deps", "--only-binary", ":all:", req]
                if version:
                    cmd += ["--python-version", version, "--target", nowhere]
                if subprocess.run([str(c) for c in cmd], capture_output=True).returncode != 0:
                    found[fw] = req
                    break
    return found


def _python_version(python: Path) -> str:
    return subprocess.check_output([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                   text=True).strip()


def _requested(build_args: list[str]) -> list[str] | None:
    """`--frameworks A,B` (or `--frameworks=A,B`) among build-horovod's arguments, else None."""
    for i, arg in enumerate(build_args):
        if arg == "--frameworks" and i + 1 < len(build_args):
            return [f.strip() for f in build_args[i + 1].split(",") if f.strip()]
        if arg.startswith("--frameworks="):
            return [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
    return None


def setup(venv: Path, build_args: list[str], say=print, gpu: bool = False, engines=()) -> None:
    """`gpu`: the GPU image's variant: pins.GPU_REPLACES, and `build-horovod --gpus` (NCCL). `engines`
    (parse_engines): added to those installed before, never removed; each installed once (the stamp)."""
    start = time.monotonic()
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    engines = parse_engines(",".join(engines))
    from toolkit.install import support
    if not support.source_tree():
        raise ToolkitError("setup makes the repository's own virtualenv and runs from a checkout only; in this "
                           "environment install what you need with pip and build Horovod with `toolkit "
                           "build-horovod` (docs/INSTALL.md)")
    if sys.version_info[:2] < pins.MIN_PYTHON:
        raise ToolkitError(f"setup needs Python {'.'.join(map(str, pins.MIN_PYTHON))} or newer (this is "
                           f"{sys.version.split()[0]}); run it as `python{pins.PYTHON} -m toolkit setup`")
    ensure_system_packages(say, compilers="--wheelhouse" not in build_args)
    ensure_java(say, engines)
    python = _venv_python(venv)
    kept = venvcache.key(pins_digest(gpu), engines, gpu)
    created = restored = False
    if not python.exists():
        if venvcache.restore(venv, kept):
            restored = True
            say(f"setup: {venv} linked from an identical setup's ({venvcache.root() / kept}; "
                f"{venvcache.ENV}=0 installs afresh)")
        else:
            say(f"setup: creating {venv}")
            _run([sys.executable, "-m", "venv", venv], "creating the virtualenv")
            created = True
    elif (theirs := _python_version(python)) != py:
        raise ToolkitError(f"setup: {venv} is Python {theirs}, this is Python {py}: give each Python its own "
                           f"virtualenv (`make setup PYTHON=python{py}` uses {default_venv().name}; or --venv DIR)")
    stamp = venv / STAMP
    written = stamp.read_text().split() if stamp.exists() else []
    installed = stamped_engines(written)
    if written[:1] != [pins_digest(gpu)]:
        wheels = framework_wheels(python, list(pins.HOROVOD_FRAMEWORKS), gpu)
        for fw, req in wheels.items():
            if req:
                say(f"setup: {fw} left out: no {req} wheel for Python {py} (toolkit/install/pins.py; "
                    f"Python {pins.PYTHON} has all three)")
        frameworks = [fw for fw, req in wheels.items() if not req]
        if not frameworks:
            raise ToolkitError(f"setup: no framework has its pinned wheels for Python {py}; use Python {pins.PYTHON}")
        say(f"setup: installing the pinned packages for {', '.join(frameworks)}" +
            (" (GPU: tensorflow instead of tensorflow-cpu, CUDA's compiler; MXNet stays CPU)" if gpu else ""))
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(pip + ["--upgrade", f"setuptools=={pins.TOOLS['setuptools']}",
                    f"wheel=={pins.TOOLS['wheel']}"], "installing setuptools")
        _run([p for p in pip if p != "-q"] + pins.requirements(gpu, frameworks), "pip install of the pinned packages",
             say)
        if pins.no_deps_requirements(frameworks):
            _run(pip + ["--no-deps"] + pins.no_deps_requirements(frameworks), "pip install of tf-keras")
        _install_toolkit(python)
        site = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       text=True).strip()
        install_numpy_shim(Path(site))
        _write_stamp(stamp, gpu, frameworks, installed)
    else:
        frameworks = written[1].split(",") if len(written) > 1 else list(pins.HOROVOD_FRAMEWORKS)
        say(f"setup: pinned packages already installed ({', '.join(frameworks)})")
        if restored:        # the kept copy's toolkit is another checkout's
            _install_toolkit(python)
    if todo := [e for e in engines if e not in installed]:
        say(f"setup: installing the engines {', '.join(todo)} ({' '.join(pins.engine_requirements(todo))})")
        install_engines(python, todo, gpu, frameworks, say)
        installed = [e for e in pins.ENGINES if e in installed or e in todo]
        _write_stamp(stamp, gpu, frameworks, installed)
    elif engines:
        say(f"setup: engines already installed ({', '.join(engines)})")
    requested = _requested(build_args)
    if requested is None:
        build_args = [*build_args, "--frameworks", ",".join(frameworks)]
    elif missing := [fw for fw in requested if fw not in frameworks]:
        raise ToolkitError(f"setup: --frameworks {','.join(requested)}: {', '.join(missing)} cannot be installed "
                           f"on Python {py} (see above); drop it or use Python {pins.PYTHON}")
    proc = subprocess.run([python, "-m", "toolkit", "build-horovod", *horovod_build_args(gpu, build_args)])
    if proc.returncode != 0:
        raise ToolkitError("setup: `toolkit build-horovod` failed (see above)")
    if created and venvcache.save(venv, kept):
        say(f"setup: kept as hard links in {venvcache.root() / kept}: the next checkout's setup links it")
    say(f"setup: ready in {time.monotonic() - start:.0f} s; activate with `source {venv}/bin/activate`")


def _install_toolkit(python: Path) -> None:
    """This checkout's toolkit, editable, into the virtualenv of `python`."""
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
          "-e", ROOT], "installing the toolkit")


def horovod_build_args(gpu: bool, build_args: list[str]) -> list[str]:
    """build-horovod's arguments from setup's: `--gpus` first for the GPU variant unless given (either spelling)."""
    if gpu and not {"--gpu", "--gpus"} & set(build_args):
        return ["--gpus", *build_args]
    return list(build_args)
