"""Uneven data and stragglers under synchronous training (issue 8): a rank with half the batches
joins (hvd.join) while the other finishes its epoch, and every epoch ends with one model again."""
import pytest

from tests.conftest import assert_replicas, digits, horovod_status, train_job

pytestmark = pytest.mark.distributed


@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
def test_a_rank_with_half_the_data_joins_and_the_replicas_agree():
    # without the join rank 0 would wait forever in its 12th allreduce of every epoch
    out = train_job("gloo", [*digits("torch"), "--epochs", "4", "--uneven-data", "1:0.5", "--straggler", "1:5"],
                    timeout=200)
    assert out["steps"] == 4 * 22 and out["world_size"] == 2
    assert out["steps_trained_per_rank"] == [4 * 22, 4 * 11], "rank 1 must train on half of its batches"
    assert_replicas(out)
    assert out["accuracy"] > 0.85
