"""The versions the toolkit is checked with outside its own `.venv`, and how a fix is phrased where the user is.

SUPPORT is the support table: each row one fresh virtualenv (a Python, one framework at one version, its
Keras) in which the built wheel installed, `toolkit build-horovod` built Horovod for what it found, `toolkit
doctor` said ready and a 2-rank job trained. `python -m benchmarks.support_matrix` (`make support`) runs the
rows and writes the table of docs/INSTALL.md; `toolkit doctor` and `toolkit build-horovod` say in one line
when a framework or Python is outside it. Stdlib only: `toolkit build-horovod` runs before any framework.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from toolkit.install import pins

DISTRIBUTION = "horovod-toolkit"     # the name on the index (`toolkit` there is an unrelated package)

# What Horovod 0.28.1 imports at run time (its setup.py: install_requires, and cffi for torch) and what a
# build in the current environment (`pip wheel --no-build-isolation`) needs: installed by `toolkit
# build-horovod` when missing, at the versions toolkit/install/pins.py pins. pyproject.toml lists the
# runtime ones as the package's own dependencies (tests/test_install.py checks the two agree).
HOROVOD_RUNTIME = ("cloudpickle", "psutil", "pyyaml", "packaging", "cffi")
HOROVOD_BUILD = ("setuptools", "wheel")


@dataclass(frozen=True)
class Row:
    """One cell of the support table: a fresh virtualenv on `python` with `requirements` installed."""
    python: str                          # "3.11"
    framework: str                       # torch | tensorflow | mxnet
    version: str                         # the framework's version ("2.13.0": the CPU wheel 2.13.0+cpu)
    requirements: tuple[str, ...]        # what pip installs besides the toolkit's wheel
    no_deps: tuple[str, ...] = ()        # installed with --no-deps (tf-keras: else pip adds the full tensorflow)
    keras: tuple[str, ...] = ()          # TensorFlow: the Keras each job ran with (keras3, tf_keras)
    note: str = ""

    @property
    def name(self) -> str:
        keras = f"+{'+'.join(self.keras)}" if self.keras else ""
        return f"py{self.python}-{self.framework}{self.version}{keras}"


# The digits examples need scikit-learn (its 8x8 digits ship with it).
_DATA = f"scikit-learn=={pins.TOOLS['scikit-learn']}"
SUPPORT = (
    Row("3.11", "torch", "2.13.0", ("torch==2.13.0+cpu", "numpy==1.26.4", _DATA), note="the CPU-only wheel"),
    Row("3.11", "torch", "2.14.1", ("torch==2.14.1", "numpy==1.26.4", _DATA), note="the CUDA 13 wheel, on the CPU"),
    Row("3.11", "tensorflow", "2.20.0", ("tensorflow-cpu==2.20.0", _DATA), ("tf-keras==2.20.1",),
        keras=("keras3", "tf_keras")),
    Row("3.11", "tensorflow", "2.21.0", ("tensorflow-cpu==2.21.0", _DATA), ("tf-keras==2.21.0",),
        keras=("keras3", "tf_keras")),
    Row("3.11", "mxnet", "1.9.1", ("mxnet==1.9.1", "numpy==1.26.4", _DATA)),
    Row("3.12", "torch", "2.14.1", ("torch==2.14.1", "numpy==1.26.4", _DATA), note="the CUDA 13 wheel, on the CPU"),
    Row("3.12", "tensorflow", "2.21.0", ("tensorflow-cpu==2.21.0", _DATA), ("tf-keras==2.21.0",),
        keras=("keras3", "tf_keras")),
    Row("3.12", "mxnet", "1.9.1", ("mxnet==1.9.1", "numpy==1.26.4", _DATA)),
)

# The distributions that carry each framework (TensorFlow: the CPU build or the full one).
DISTRIBUTIONS = {"torch": ("torch",), "tensorflow": ("tensorflow-cpu", "tensorflow"), "mxnet": ("mxnet",)}


def tested(framework: str) -> tuple[str, ...]:
    return tuple(sorted({r.version for r in SUPPORT if r.framework == framework}))


def tested_pythons() -> tuple[str, ...]:
    return tuple(sorted({r.python for r in SUPPORT}))


def version(distribution: str) -> str | None:
    """The installed version of a distribution, from its metadata (nothing imported), else None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed(framework: str) -> str | None:
    """The installed version of `framework` (the first of its distributions installed), else None."""
    return next(filter(None, map(version, DISTRIBUTIONS[framework])), None)


def found() -> dict[str, str]:
    """Every framework installed here -> its version."""
    return {fw: v for fw in DISTRIBUTIONS if (v := installed(fw))}


def outside(framework: str, version: str) -> str:
    """'' when `version` (its local label, e.g. +cpu, ignored) is in the table, else one line saying so."""
    base = version.split("+")[0]
    if base in tested(framework):
        return ""
    return (f"{framework} {version} is outside the tested versions ({', '.join(tested(framework))}; "
            f"docs/INSTALL.md)")


def python_outside() -> str:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return "" if py in tested_pythons() else \
        f"Python {py} is outside the tested versions ({', '.join(tested_pythons())}; docs/INSTALL.md)"


# ----- fixes where the user is ------------------------------------------------------------------------

CHECKOUT = Path(__file__).resolve().parents[2]     # the repository, when the toolkit runs from one


def source_tree() -> bool:
    """Whether this toolkit runs from its sources (pyproject.toml and adapters/ beside toolkit/: a checkout, or
    the Docker images' copy of it), which `toolkit setup` installs from; an installed wheel has neither."""
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "adapters").is_dir()


def in_checkout() -> bool:
    """Whether this toolkit runs from its repository with the Makefile (`make setup` is a fix there only):
    an installed wheel lives in site-packages, with no Makefile beside it."""
    return (CHECKOUT / "Makefile").is_file() and (CHECKOUT / "toolkit" / "install" / "pins.py").is_file()


def pip(*requirements: str) -> str:
    """The pip command of this Python for `requirements`, quoted for a shell."""
    return f"{Path(sys.executable).name} -m pip install {' '.join(shlex.quote(r) for r in requirements)}"


def fix(command: str) -> str:
    """`command` (a pip or toolkit command that works anywhere), and `make setup` beside it in a checkout."""
    return f"`{command}`" + (" (or `make setup`)" if in_checkout() else "")


def install_fix(*requirements: str) -> str:
    return fix(pip(*requirements))


def pinned(*names: str) -> tuple[str, ...]:
    """`name==pin` for each name pins.py pins (TOOLS, FRAMEWORKS, NO_DEPS), else the bare name."""
    every = {**pins.FRAMEWORKS, **pins.NO_DEPS, **pins.TOOLS}
    return tuple(f"{n}=={every[n]}" if n in every else n for n in names)


def missing(names) -> list[str]:
    """The distributions of `names` not installed here."""
    return [name for name in names if version(name) is None]
