"""The exchange in buckets beside the backward pass (toolkit/exchange/buckets.py) on simulated ranks (threads
meeting in simulated collectives): the same values as the exchange of the whole gradient, bit for bit, whatever
order the backward pass readies the parameters in. The real 2-rank jobs are in tests/test_distributed_communication.py."""
import numpy as np
import pytest

from tests.test_compression import Ranks, host
from tests.test_hierarchy import Session, Strategy
from toolkit.exchange import buckets, hierarchy
from toolkit.exchange.arrays import numpy_ops
from toolkit.exchange.compression import INT8_BLOCK, make
from toolkit.exchange.exchanges import GradientExchange

SIZES = [700, 33, 2000, 1, 513, 1200, 90]      # parameters' values, in the model's order


def test_the_buckets_cover_the_gradient_from_its_end_in_whole_blocks():
    n = sum(SIZES)
    for cap in (1, 256, 1000, 10**6):
        plan = buckets.plan(SIZES, cap)
        assert plan[0][1] == n and plan[-1][0] == 0
        assert all(nxt[1] == cur[0] for cur, nxt in zip(plan, plan[1:]))     # contiguous, from the end
        assert all(a % INT8_BLOCK == 0 and e > a for a, e in plan)
        assert all(e - a <= max(cap, INT8_BLOCK) + INT8_BLOCK for a, e in plan)
    assert len(buckets.plan(SIZES, 10**6)) == 1


def _grads(rank, step):
    rs = np.random.RandomState(100 * step + rank)
    return [rs.randn(s).astype(np.float32) * (1 + i) for i, s in enumerate(SIZES)]


def _run(name, k, h, bucketed, steps=3, order=None, missing=(), hierarchical=False):
    """Each rank's (what it applied each step, its exchange) for k x h simulated ranks; with `bucketed`, the
    gradients readied one parameter at a time in `order` (default: the backward pass's, last first), the
    parameters in `missing` never (a parameter the loss did not reach: the step hands it over)."""
    ops, world = numpy_ops(), k * h
    strategy, everyone = Strategy(world, ops), Ranks(world, ops)
    order = list(reversed(range(len(SIZES)))) if order is None else order

    def make_one(session, shape, values):
        if hierarchical:
            cross = GradientExchange(make(name, ops=ops), True, average=False)
            return hierarchy.HierarchicalExchange(cross, hierarchy.levels(session, shape), True, values)
        return GradientExchange(make(name, ops=ops), True, average=True)

    def rank_main(rank, _comm):
        session = Session(strategy, everyone, rank, k)
        comm = session if hierarchical else session.everyone
        shape = hierarchy.place([(r % k, k) for r in range(world)])
        if bucketed:
            levels = hierarchy.levels(session, shape) if hierarchical else None
            ex = buckets.BucketedExchange(
                lambda m: (hierarchy.HierarchicalExchange(GradientExchange(make(name, ops=ops), True, average=False),
                                                          levels, True, m) if hierarchical
                           else GradientExchange(make(name, ops=ops), True, average=True)),
                SIZES, 1024, ops)
            ex.bind(comm, world)
        else:
            ex = make_one(session, shape, sum(SIZES))
            if not hierarchical:
                ex.choose_form(sum(SIZES), world)
        applied = []
        for t in range(steps):
            grads = _grads(rank, t)
            if bucketed:
                ex.arm(True)
                for i in order:
                    if i not in missing:
                        ex.ready(i, grads[i])
            out = ex.exchange(grads, comm, world)
            applied.append(np.concatenate([host(ops, g).ravel() for g in out]))
        return applied, ex
    return everyone.run(rank_main)


@pytest.mark.parametrize("name", ["int8", "bf16"])
@pytest.mark.parametrize("world", [2, 3])
def test_buckets_apply_the_whole_exchanges_values_bit_for_bit(name, world):
    """Every step (error feedback carried over 3 steps), in the backward pass's order, in another order and
    with a parameter no hook readied: the values every rank applies are the whole gradient's exchange's."""
    whole = _run(name, world, 1, bucketed=False)
    for kwargs in ({}, {"order": [3, 0, 6, 1, 5, 2, 4]}, {"missing": (2,)}):
        split = _run(name, world, 1, bucketed=True, **kwargs)
        assert len(split[0][1].buckets) > 3
        started = 3 * len(split[0][1].buckets) if not kwargs else None      # every bucket, every step, by `ready`
        assert started is None or split[0][1].early == started
        assert split[0][1].form == whole[0][1].form == ("reduce" if world == 3 else "allgather")
        for rank in range(world):
            assert all(np.array_equal(a, b) for a, b in zip(whole[rank][0], split[rank][0])), (rank, kwargs)
            rows, split_rows = whole[rank][1].state(), split[rank][1].state()
            assert np.array_equal(host(numpy_ops(), rows["residuals"]), host(numpy_ops(), split_rows["residuals"]))


def test_buckets_of_the_hierarchical_exchange_apply_its_values():
    whole = _run("int8", 2, 2, bucketed=False, hierarchical=True)
    split = _run("int8", 2, 2, bucketed=True, hierarchical=True)
    for rank in range(4):
        assert all(np.array_equal(a, b) for a, b in zip(whole[rank][0], split[rank][0])), rank
    assert all(np.array_equal(split[0][0][t], split[r][0][t]) for r in range(4) for t in range(3))


def test_a_backward_pass_that_is_not_the_last_micro_batch_starts_nothing():
    ops = numpy_ops()
    ex = buckets.BucketedExchange(lambda m: GradientExchange(make("int8", ops=ops), True), SIZES, 1024, ops)
    ex.bind(None, 2)
    ex.arm(False)
    for i in reversed(range(len(SIZES))):
        ex.ready(i, _grads(0, 0)[i])
    assert ex._next == 0 and ex.early == 0 and all(f is None for f in ex._filled)


def test_the_state_round_trips_through_a_checkpoint_row():
    _, ex = _run("int8", 3, 1, bucketed=True)[1]
    saved = {name: host(numpy_ops(), row).copy() for name, row in ex.state().items()}
    assert set(saved) == {"residuals", "owner_residuals"} and all(len(r) == sum(SIZES) for r in saved.values())
    ops = numpy_ops()
    again = buckets.BucketedExchange(lambda m: GradientExchange(make("int8", ops=ops), True), SIZES, 1024, ops)
    again.load_state(saved)
    assert all(np.array_equal(host(ops, again.state()[name]), saved[name]) for name in saved)
