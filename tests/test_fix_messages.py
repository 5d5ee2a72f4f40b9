"""Errors that name a fix: a backend without a feature, a communicator handed to TensorFlow's native strategies,
TOOLKIT_REQUIRE_GPU without a GPU, a failed apt-get; each is one line saying what to do, not where to read the
source."""
import subprocess
import sys
import types

import pytest

from tests.conftest import ROOT
from toolkit.adapters.horovod import require_gpu_if_asked
from toolkit.adapters.strategy import Strategy
from toolkit.errors import ToolkitError
from toolkit.install import envsetup


@pytest.mark.parametrize("name, other", [("native", "horovod"), ("horovod", "native")])
def test_a_backend_without_a_feature_names_the_other_backend_not_the_source(name, other):
    strategy = types.SimpleNamespace(name=name, config=types.SimpleNamespace(framework="tensorflow"))
    message = str(Strategy.refuse(strategy, "join"))
    assert f"backend={name} (tensorflow) has no join; use backend: {other}" in message, message
    assert "registry.py" not in message and "\n" not in message


def test_require_gpu_without_a_gpu_names_the_driver_the_visible_devices_and_the_wheel(monkeypatch):
    monkeypatch.setenv("TOOLKIT_REQUIRE_GPU", "1")
    with pytest.raises(ToolkitError) as e:
        require_gpu_if_asked(False)
    for needle in ("nvidia-smi", "CUDA_VISIBLE_DEVICES", "CPU-only wheel", "unset TOOLKIT_REQUIRE_GPU"):
        assert needle in str(e.value), str(e.value)
    require_gpu_if_asked(True)


def test_a_failed_apt_get_is_its_last_line_and_what_to_do(monkeypatch):
    failed = subprocess.CompletedProcess([], 100, stdout="", stderr="Reading package lists...\n"
                                         "E: Unable to locate package openmpi-bin\n")
    monkeypatch.setattr(envsetup.subprocess, "run", lambda *a, **kw: failed)
    with pytest.raises(ToolkitError) as e:
        envsetup._apt_get(["openmpi-bin"])
    assert str(e.value) == ("`apt-get update -q` failed (exit 100): E: Unable to locate package openmpi-bin; run it "
                            "yourself to see the whole output, then `toolkit setup` again"), str(e.value)


TENSORFLOW_NATIVE = """
import types
from toolkit.errors import ToolkitError
from toolkit.adapters.tensorflow.native import NativeSession
from toolkit.adapters.tensorflow.strategies.native import TensorflowNative
for call in (lambda: TensorflowNative.start(types.SimpleNamespace(config=None), comm=object()),
             lambda: NativeSession.local_gradients(None)):
    try:
        call()
    except ToolkitError as e:
        print(e)
"""


def test_tensorflows_native_strategies_name_the_fix():
    proc = subprocess.run([sys.executable, "-c", TENSORFLOW_NATIVE], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2, proc.stdout + proc.stderr[-2000:]
    assert "drop comm= from toolkit.start, or use backend: horovod" in lines[0], lines
    assert "run on backend: horovod; or use compression: none" in lines[1], lines
