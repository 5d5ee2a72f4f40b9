"""Keras 3 `model.fit` on Horovod (horovod.tensorflow.keras itself fails on Keras 3)."""
import sys

import pytest

from tests.conftest import ROOT, summary, run
from toolkit import horovod_build

pytestmark = pytest.mark.distributed


def test_fit_on_two_ranks_starts_different_and_ends_identical():
    why = horovod_build.extension_status(["tensorflow"])["tensorflow"]
    if why:
        pytest.skip(f"horovod.tensorflow does not import ({why})")
    out = summary(run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60",
                       sys.executable, ROOT / "examples" / "keras3_fit.py", "--epochs", "8"], timeout=300))
    assert out["world_size"] == 2
    assert out["initial_digests"][0] != out["initial_digests"][1]
    # each rank fits its own half of the data: only the allreduce keeps the replicas equal
    assert len(set(out["final_digests"])) == 1
    assert out["accuracy"] > 0.9
