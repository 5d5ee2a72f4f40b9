"""build-horovod's progress (toolkit/install/buildlog.py): CMake's percent read from the build's log while it
runs, a line at the interval with the time so far, the duration at the end; no lines under CI."""
import threading
import time

from toolkit.install import buildlog

LOG = """toolkit: toolchain GCC 12.2.0
  -- The CXX compiler identification is GNU 12.2.0 (cmake)
  [  0%] Building CXX object third_party/gloo/gloo/CMakeFiles/gloo.dir/algorithm.cc.o
  [ 45%] Building CXX object horovod/torch/CMakeFiles/pytorch.dir/mpi_ops_v2.cc.o
"""


def test_progress_is_cmakes_last_percent_or_the_stage_before_it():
    assert buildlog.progress(LOG) == ("45% of the build steps (Building CXX object horovod/torch/CMakeFiles/pytorch.dir/"
                                      "mpi_ops_v2.cc.o)")
    assert buildlog.progress(LOG.split("  [")[0]) == "configuring (CMake)"
    assert buildlog.progress("") == "preparing the sources"
    assert buildlog.minutes(845.2) == "14 min 05 s"


def test_a_running_build_says_where_it_is_at_the_interval(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("")
    said = []

    def build():          # what pip -v writes while Horovod compiles
        for line in LOG.splitlines():
            with open(log, "a") as f:
                f.write(line + "\n")
            time.sleep(0.05)

    with buildlog.Progress(log, said.append, every=0.03) as progress:
        worker = threading.Thread(target=build)
        worker.start()
        worker.join()
        time.sleep(0.1)
    assert said and all(line.startswith("horovod: ") and line.endswith(" so far") for line in said), said
    assert said[-1].startswith("horovod: 45% of the build steps"), said
    count = len(said)
    time.sleep(0.1)
    assert len(said) == count and progress.took() == "0 min 00 s"     # nothing after the build ended


def test_no_progress_lines_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert buildlog.default_every() is None
    monkeypatch.delenv("CI")
    assert buildlog.default_every() in (30.0, 300.0)


PIP_OUTPUT = """Collecting torch==2.14.1
  Downloading torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl (915.3 MB)
Collecting numpy==1.26.4
  Using cached numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl (18.3 MB)
Collecting filelock
  Downloading https://files.example/packages/filelock-3.20.0-py3-none-any.whl (16 kB)
Installing collected packages: numpy, filelock, torch
"""


def test_setup_says_each_package_pip_fetches_with_its_size_and_nothing_under_ci(monkeypatch):
    """setup's pip installs: one line per wheel downloaded or taken from pip's cache, with its size, as pip
    says it (a stand-in printing pip 25's lines: the suite reaches no index); none under CI; a failure keeps
    pip's last lines."""
    import sys

    import pytest

    from toolkit.errors import ToolkitError
    from toolkit.install.envsetup import _run
    fake = [sys.executable, "-c", f"import sys; sys.stdout.write({PIP_OUTPUT!r}); sys.exit(int(sys.argv[1]))"]
    monkeypatch.delenv("CI", raising=False)
    said: list[str] = []
    _run(fake + ["0"], "pip install", said.append)
    assert said == ["setup:   torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl (915.3 MB)",
                    "setup:   numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl (18.3 MB)",
                    "setup:   filelock-3.20.0-py3-none-any.whl (16 kB)"]
    with pytest.raises(ToolkitError, match="pip install failed \\(exit 3\\):\nCollecting torch"):
        _run(fake + ["3"], "pip install", said.append)
    monkeypatch.setenv("CI", "true")
    quiet: list[str] = []
    _run(fake + ["0"], "pip install", quiet.append)
    assert quiet == []
