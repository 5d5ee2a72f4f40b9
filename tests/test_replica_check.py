"""The trainer's last word before its summary: every replica's parameters are compared, and a
mismatch stops the job. Unit-tested here with a stand-in for the collective, because a correct
trainer never produces the mismatch (tests/break_claims.py shows the jobs fail when the broadcast
or the allreduce is broken)."""
import numpy as np
import pytest

from toolkit import trainer
from toolkit.errors import ToolkitError


class TwoRanks:
    """What allgather_object returns on a rank of a 2-rank job whose other rank holds `other`."""

    def __init__(self, mine, other):
        self.mine, self.other = mine, other

    def replica_parameters(self):
        return [self.mine]

    def allgather_object(self, obj, name):
        assert name == "toolkit.final_digest"
        return [obj, [trainer.digest(self.other)]]


def test_identical_replicas_pass_and_return_every_digest():
    w = [np.arange(4, dtype=np.float32), np.ones(2, np.float32)]
    digests = trainer.check_replicas(TwoRanks(w, [a.copy() for a in w]))
    assert len(digests) == 2 and digests[0] == digests[1] == trainer.digest(w)


def test_one_differing_bit_stops_the_job():
    w = [np.arange(4, dtype=np.float32)]
    other = [w[0].copy()]
    other[0].view(np.uint32)[3] ^= 1        # the last bit of one value
    with pytest.raises(ToolkitError, match="replica check failed") as e:
        trainer.check_replicas(TwoRanks(w, other))
    assert e.value.code == 1
