"""The hierarchical exchange (toolkit/exchange/hierarchy.py) on simulated ranks: threads that meet in
simulated collectives, among every rank or among a group's (numpy and torch buffers). The real jobs
(horovodrun and torchrun on two namespace hosts) are in tests/test_hierarchy_jobs.py."""
import threading

import numpy as np
import pytest

from tests.test_compression import Comm, Ranks, host, namespaces
from toolkit.exchange import arrays, hierarchy
from toolkit.exchange.compression import make
from toolkit.exchange.exchanges import GradientExchange


@pytest.fixture(params=namespaces())
def ops(request):
    return arrays.numpy_ops() if request.param == "numpy" else arrays.Torch("cuda" if request.param == "cuda" else "cpu")


class Strategy:
    """new_group as a strategy makes it: every rank calls it for every group; members share one Ranks."""
    groups = True

    def __init__(self, world, ops):
        self.world, self.ops, self.lock, self.made = world, ops, threading.Lock(), {}

    def new_group(self, ranks):
        with self.lock:
            return self.made.setdefault(tuple(ranks), (Ranks(len(ranks), self.ops), list(ranks)))


class Session:
    """The session verbs the exchange calls, over the simulated collectives."""

    def __init__(self, strategy, everyone, rank, k):
        self.strategy, self.everyone, self.rank = strategy, Comm(everyone, rank), rank
        self.local_rank, self.local_size = rank % k, k

    def _comm(self, group):
        if group is None:
            return self.everyone
        ranks, members = group
        return Comm(ranks, members.index(self.rank))

    def allgather(self, array, group=None):
        return self._comm(group).allgather(array)

    def alltoall(self, array, splits, group=None):
        return self._comm(group).alltoall(array, splits)

    def allreduce(self, array, average=True, group=None):
        return self._comm(group).allreduce(array, average)


def run(ops, k, h, name, grads, steps=1, hierarchical=True):
    """Each rank's (applied gradients summed over the steps, its exchange) for a K x H job."""
    world = k * h
    strategy = Strategy(world, ops)
    everyone = Ranks(world, ops)

    def rank_main(rank, _comm):
        session = Session(strategy, everyone, rank, k)
        shape = hierarchy.place([(r % k, k) for r in range(world)])
        ex = GradientExchange(make(name, ops=ops), name != "none", average=False)
        if hierarchical:
            ex = hierarchy.HierarchicalExchange(ex, hierarchy.levels(session, shape), True, len(grads[0][0]))
        else:
            ex.average = True
        applied = np.zeros(len(grads[0][0]), np.float32)
        for t in range(steps):
            applied += host(ops, ex.exchange([ops.from_numpy(grads[t][rank])], session, world)[0])
        return applied, ex
    return everyone.run(rank_main)


@pytest.mark.parametrize("name", ["bf16", "int8", "none"])
@pytest.mark.parametrize("k,h", [(2, 2), (3, 2), (2, 3)])
def test_every_rank_gets_the_same_mean_and_only_its_shard_crosses_hosts(ops, name, k, h):
    """K ranks on each of H hosts: every rank applies the same bits, within two quantisations of the
    true mean (float32's rounding for none); what a rank hands to collectives across hosts is its shard
    (1/K of the gradient) compressed, what it hands inside the host is float32."""
    n, world = 7 * 256 + 5, k * h
    grads = [[np.random.RandomState(r).randn(n).astype(np.float32) * 3 for r in range(world)]]
    results = run(ops, k, h, name, grads)
    assert all(np.array_equal(results[0][0], r[0]) for r in results[1:])
    mean = sum(grads[0]) / world
    step = {"int8": np.abs(mean).max() / 127 * 2, "bf16": np.abs(mean).max() / 128 * 2, "none": 1e-5}[name]
    assert np.abs(results[0][0] - mean).max() <= step + 1e-6
    per_value = {"int8": 1, "bf16": 2, "none": 4}[name]
    for applied, ex in results:
        a, e = ex.span
        across = sum(b for _, b, _, level in ex.calls if level == "cross")
        inside = [(kind, b) for kind, b, size, level in ex.calls if level == "host"]
        assert inside == [("alltoall", 4 * n), ("allgather", 4 * (e - a))]
        # the shard compressed (int8: and one float32 scale per block of 256 values); the compressed
        # allreduce (from 3 hosts) hands over its reduced chunk too, 1/H of it; parts padded to 8 bytes
        def size(values):
            return values * per_value + (4 * -(-values // 256) if name == "int8" else 0)
        expected = size(e - a)
        if ex.cross_form == "reduce":
            start, end = ex.cross.chunks(e - a, h)[ex.levels.host]
            expected += size(end - start)
        assert ex.cross_form == ("allreduce" if name == "none" else "allgather" if h == 2 else "reduce")
        assert expected - 1 <= across <= expected + 16 * (h + 1)
        assert abs((e - a) - n / k) <= 256


@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_error_feedback_keeps_what_each_rank_did_not_send_of_its_shard(ops, name):
    """Over steps, what every rank applied + the ranks' residuals (each of its shard, summed inside a
    host as the shards were) == the sum of the true means: nothing lost, only delayed."""
    k, h, n, steps = 2, 2, 1500, 4
    world = k * h
    grads = [[np.random.RandomState(10 * t + r).randn(n).astype(np.float32) for r in range(world)]
             for t in range(steps)]
    results = run(ops, k, h, name, grads, steps)
    true = sum(sum(g) / world for g in grads)
    kept = np.zeros(n, np.float32)
    for _, ex in results:
        for row in ex.state().values():         # whole-gradient rows, zero outside the rank's shard
            kept += host(ops, row)
    assert np.allclose(results[0][0] + kept / world, true, atol=1e-4)
    assert np.abs(kept).max() > 1e-4
    first = results[0][1]
    rows = first.state()
    a, e = first.span
    assert all(len(row) == n for row in rows.values())
    assert all(not host(ops, row)[:a].any() and not host(ops, row)[e:].any() for row in rows.values())


def test_state_round_trips_through_a_checkpoint_row(ops):
    k, h, n = 2, 2, 1500
    grads = [[np.random.RandomState(r).randn(n).astype(np.float32) for r in range(4)]]
    _, ex = run(ops, k, h, "int8", grads)[1]
    saved = {name: ops.from_numpy(host(ops, row).copy()) for name, row in ex.state().items()}
    again = hierarchy.HierarchicalExchange(GradientExchange(make("int8", ops=ops), True, average=False),
                                           ex.levels, True, n)
    again.load_state(saved)
    assert all(np.array_equal(host(ops, again.state()[name]), host(ops, saved[name])) for name in saved)


def test_place_reads_hosts_from_the_ranks_local_ranks():
    assert hierarchy.place([(r % 2, 2) for r in range(4)]) == (2, 2)
    assert hierarchy.place([(0, 1), (0, 1)]) == (1, 2)
    assert "different numbers" in hierarchy.place([(0, 2), (1, 2), (0, 1)])
    assert "host by host" in hierarchy.place([(0, 2), (0, 2), (1, 2), (1, 2)])



@pytest.mark.parametrize("name", ["bf16", "int8", "none"])
@pytest.mark.parametrize("n", [3, 100])
def test_a_gradient_smaller_than_a_block_a_rank_still_reduces(ops, name, n):
    """Fewer 256-value blocks than ranks on a host: some shards are empty; every rank still applies the same
    mean, within the compression's error, over two steps (error feedback on the shards that are not empty)."""
    grads = [[np.random.RandomState(10 * t + r).randn(n).astype(np.float32) for r in range(4)] for t in range(2)]
    results = run(ops, 2, 2, name, grads, steps=2)
    assert all(np.array_equal(results[0][0], r[0]) for r in results[1:])
    assert np.abs(results[0][0] - sum(sum(g) / 4 for g in grads)).max() < 0.05
    spans = [results[r][1].span for r in (0, 1)]        # a host's two shards cover the gradient once
    assert spans[0][0] == 0 and spans[0][1] == spans[1][0] and spans[1][1] == n
