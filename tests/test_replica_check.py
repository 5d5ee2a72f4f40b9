"""The session's last word before a summary: every replica's parameters are compared, and a
mismatch stops the job. Unit-tested here with a stand-in for the collective, because a correct
trainer never produces the mismatch (tests/break_claims.py shows the jobs fail when the broadcast
or the allreduce is broken)."""
import numpy as np
import pytest

from toolkit.adapters.base import Session, digest
from toolkit.config import Config
from toolkit.errors import ToolkitError


class TwoRanks(Session):
    """What a rank of a 2-rank job sees when the other rank holds `other`."""
    def __init__(self, mine, other):
        super().__init__(Config(), strategy=None)     # its one collective is below
        self.mine, self.other = mine, other

    size = replicas = 1     # sync_buffers: nothing to average (one rank, one replica in it)

    def replica_parameters(self):
        return [self.mine]

    def allgather_object(self, obj, name):
        assert name == "toolkit.final_digest"
        return [obj, [digest(self.other)]]


TwoRanks.__abstractmethods__ = frozenset()      # only the collective and the parameters are needed here


def test_identical_replicas_pass_and_return_every_digest():
    w = [np.arange(4, dtype=np.float32), np.ones(2, np.float32)]
    digests = TwoRanks(w, [a.copy() for a in w]).check_replicas()
    assert len(digests) == 2 and digests[0] == digests[1] == digest(w)


def test_one_differing_bit_stops_the_job():
    w = [np.arange(4, dtype=np.float32)]
    other = [w[0].copy()]
    other[0].view(np.uint32)[3] ^= 1        # the last bit of one value
    with pytest.raises(ToolkitError, match="replica check failed") as e:
        TwoRanks(w, other).check_replicas()
    assert e.value.code == 1
