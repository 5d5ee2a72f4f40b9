"""The environment `make setup` promises: Horovod built for all three frameworks, MXNet importable."""
import subprocess
import sys

import pytest

from toolkit import horovod_build, pins

pytest.importorskip("horovod", reason="run `make setup` to build Horovod")


def test_every_horovod_extension_really_imports():
    status = horovod_build.extension_status()
    assert status == {fw: None for fw in pins.HOROVOD_FRAMEWORKS}, status


def test_installed_build_is_the_cached_one():
    key = horovod_build.installed_key()
    assert key is not None and key.startswith(f"horovod{pins.HOROVOD}_")
    assert list((horovod_build.cache_dir() / key).glob("horovod-*.whl")), "the build must be cached"


def test_numpy_shim_is_lazy_and_lets_mxnet_import():
    code = ("import sys; assert 'numpy' not in sys.modules, 'shim imported numpy at start-up'\n"
            "import mxnet, numpy; assert numpy.bool is bool; print(mxnet.__version__)")
    out = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == pins.FRAMEWORKS["mxnet"]
