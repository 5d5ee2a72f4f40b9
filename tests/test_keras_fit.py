"""Keras `model.fit` on Horovod: Keras 3 (the toolkit's callbacks and optimizer) and tf-keras (Horovod's)."""
import sys

import pytest

from tests.conftest import ROOT, horovod_status, run, summary

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("keras", ["keras3", "tf_keras"])
def test_fit_on_two_ranks_starts_different_and_ends_identical(keras):
    why = horovod_status("tensorflow")
    if why:
        pytest.skip(f"horovod.tensorflow does not import ({why})")
    out = summary(run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60",
                       sys.executable, ROOT / "examples" / "keras_fit.py", "--keras", keras, "--epochs", "8"],
                      timeout=300))
    assert out["world_size"] == 2 and out["keras"] == keras
    assert out["initial_digests"][0] != out["initial_digests"][1]
    # each rank fits its own half of the data: only the allreduce keeps the replicas equal
    assert len(set(out["final_digests"])) == 1
    assert out["accuracy"] > 0.9
