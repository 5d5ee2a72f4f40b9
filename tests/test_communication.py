"""toolkit/exchange/communication.py and the exchange on simulated ranks: threads sharing numpy collectives.

The adapter here is a least-squares model with SGD + momentum written in numpy, so every number
can be checked; the real frameworks run the same code in tests/test_distributed_communication.py.
"""
import threading
import types

import numpy as np
import pytest

from toolkit.config import Config
from toolkit.exchange.communication import Communication
from toolkit.exchange.compression import TopK
from toolkit.exchange.exchanges import GradientExchange

FEATURES = 50


class Group:
    """Collectives between `world` threads: each puts its array in, all get the combination back."""

    def __init__(self, world):
        self.world, self.slots, self.barrier = world, [None] * world, threading.Barrier(world, timeout=30)

    def collective(self, rank, array, combine):
        self.slots[rank] = np.array(array)
        self.barrier.wait()
        out = combine(list(self.slots))
        self.barrier.wait()
        return out


class LeastSquares:
    """A session's tensor side (what toolkit.exchange.communication calls), in numpy: w <- w - lr * m,
    m <- momentum * m + grad."""
    name = "numpy"
    strategy = types.SimpleNamespace(groups=False)      # no groups of ranks: the flat exchange

    def __init__(self, group, rank, lr=0.05, momentum=0.9):
        self.group, self.rank, self.lr, self.momentum = group, rank, lr, momentum
        self.w, self.m = np.zeros(FEATURES, np.float32), np.zeros(FEATURES, np.float32)

    def weights(self):
        return [self.w]

    def local_gradients(self, batches):
        x, y = batches[0]
        err = x @ self.w - y
        return float(np.mean(err ** 2)), [(x.T @ err / len(x)).astype(np.float32)]

    def apply_gradients(self, grads):
        self.m = (self.momentum * self.m + grads[0]).astype(np.float32)
        self.w = (self.w - self.lr * self.m).astype(np.float32)

    def _train_step(self, batches):       # what Horovod's optimizer does: allreduce, then step
        loss, grads = self.local_gradients(batches)
        self.apply_gradients([self.allreduce(grads[0])])
        return loss

    def get_state(self):
        return [self.w, self.m]

    def set_state(self, arrays):
        self.w, self.m = (a.astype(np.float32) for a in arrays)

    def allgather(self, array):
        return self.group.collective(self.rank, array, np.concatenate)

    def allreduce(self, array, average=True):
        return self.group.collective(self.rank, array, lambda xs: sum(xs) / (len(xs) if average else 1))


def batches_for(rank, step):
    rng = np.random.RandomState(1000 * step + rank)
    x = rng.randn(16, FEATURES).astype(np.float32)
    return [(x, (x @ np.linspace(-1, 1, FEATURES) + 0.1 * rng.randn(16)).astype(np.float32))]


def train(world=2, steps=24, epoch_ends=(), momentum=0.9, **config):
    """Run `steps` steps on `world` threads; returns each rank's (adapter, Communication)."""
    group, out = Group(world), [None] * world
    errors = []

    def rank_main(rank):
        try:
            adapter = LeastSquares(group, rank, momentum=momentum)
            resolved = Config.from_dict(config)
            comm = Communication(resolved, adapter, rank, world, exchange=resolved.toolkit_exchange)
            for step in range(steps):       # the facade's routing (adapters/base.py Session._finish_step)
                batches = batches_for(rank, step)
                if comm.toolkit:
                    _, grads = adapter.local_gradients(batches)
                    comm.exchange_and_apply(grads, step)
                else:
                    comm.count_backend_step()
                    adapter._train_step(batches)
                if step + 1 in epoch_ends:
                    comm.end_epoch()
            out[rank] = (adapter, comm)
        except BaseException as e:       # surfaces in the test, not as a silent thread death
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def test_local_sgd_with_one_local_step_equals_synchronous_training():
    sync = train()
    local = train(sync="local_sgd", local_steps=1)
    for (a, _), (b, _) in zip(sync, local):
        assert np.abs(a.w - b.w).max() < 1e-6
    assert np.abs(sync[0][0].w).max() > 0.1, "it trained"
    # and not trivially: more local steps give another model
    assert np.abs(train(sync="local_sgd", local_steps=4)[0][0].w - sync[0][0].w).max() > 1e-3


def test_local_sgd_replicas_drift_then_end_identical():
    drifting = train(steps=10, sync="local_sgd", local_steps=4)      # 2 steps since the last average
    assert np.abs(drifting[0][0].w - drifting[1][0].w).max() > 1e-4
    averaged = train(steps=10, epoch_ends=(10,), sync="local_sgd", local_steps=4)
    (a, comm), (b, _) = averaged
    assert np.array_equal(a.w, b.w) and np.array_equal(a.m, b.m)
    # 3 averages (after steps 4, 8 and the epoch's end), each one allreduce of w and m
    assert comm.bytes_sent == 3 * 2 * FEATURES * 4 and comm.since_average == 0


def test_local_sgd_warmup_steps_are_synchronous():
    warm = train(steps=6, sync="local_sgd", local_steps=100, sync_warmup_steps=6)
    sync = train(steps=6)
    assert np.abs(warm[0][0].w - sync[0][0].w).max() < 1e-6
    assert np.array_equal(warm[0][0].w, warm[1][0].w)
    assert warm[0][1].bytes_sent == 6 * FEATURES * 4     # dense float32 gradients, every warm-up step


def loss_of(w):
    x, y = batches_for(7, 999)[0]
    return float(np.mean((x @ w - y) ** 2))


@pytest.mark.parametrize("compression", ["bf16", "int8", "topk"])
def test_compressed_exchange_gives_every_rank_the_same_model(compression):
    # plain SGD: with momentum 0.9 this badly conditioned problem diverges under top-k + error
    # feedback (delayed coordinates meet momentum); digits trains fine (docs/COMMUNICATION.md)
    (a, comm), (b, _) = train(steps=100, momentum=0.0, compression=compression,
                              **({"topk_ratio": 0.1} if compression == "topk" else {}))
    assert np.array_equal(a.w, b.w)
    dense = train(steps=100, momentum=0.0)[0][0].w
    assert loss_of(a.w) < 1.5 * loss_of(dense) and loss_of(dense) < 0.05, "it learns as well as uncompressed"
    # 50 values: 200 dense bytes against 100 (bf16), 50 + 4 (int8), 5 x 3 (top-k), each part padded to
    # 8 bytes, plus the 4-8 byte header
    assert comm.summary()["compression_ratio"] > {"bf16": 1.8, "int8": 2.5, "topk": 6}[compression]


def test_error_feedback_is_what_makes_top_k_learn():
    with_ef = train(steps=100, momentum=0.0, compression="topk", topk_ratio=0.1)[0][0].w
    without = train(steps=100, momentum=0.0, compression="topk", topk_ratio=0.1, error_feedback=False)[0][0].w
    assert loss_of(without) > 10 * loss_of(with_ef)


def test_exchange_result_is_the_mean_of_what_the_ranks_sent():
    grads = [np.random.RandomState(r).randn(1000).astype(np.float32) for r in range(2)]
    topk, group, out = TopK(0.05), Group(2), [None, None]

    def rank_main(r):           # each rank its own compressor, as in a job (TopK keeps its last positions)
        adapter = LeastSquares(group, r)
        out[r] = GradientExchange(TopK(0.05), error_feedback=False).exchange([grads[r]], adapter, 2)[0]

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    expected = sum(topk.decompress(topk.compress(g), 1000) for g in grads) / 2
    assert np.array_equal(out[0], out[1]) and np.allclose(out[0], expected)
    assert np.count_nonzero(out[0]) <= 2 * topk.k(1000)


def test_error_feedback_nothing_is_lost_across_ranks():
    """Sum of what was applied + the ranks' residuals (averaged) == sum of the ranks' gradients (averaged)."""
    steps, group, applied, residuals = 12, Group(2), [None, None], [None, None]
    grads = {(r, s): np.random.RandomState(10 * s + r).randn(500).astype(np.float32) for r in range(2)
             for s in range(steps)}

    def rank_main(r):
        adapter, ex = LeastSquares(group, r), GradientExchange(TopK(0.02), error_feedback=True)
        total = np.zeros(500, np.float64)
        for s in range(steps):
            total += ex.exchange([grads[r, s]], adapter, 2)[0]
        applied[r], residuals[r] = total, ex.residual

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    given = sum(grads.values()) / 2
    assert np.allclose(applied[0] + (residuals[0] + residuals[1]) / 2, given, atol=1e-4)
    assert np.abs(residuals[0]).max() > 0


def test_residuals_and_counter_survive_a_checkpoint(tmp_path):
    before = train(steps=5, compression="topk", topk_ratio=0.1)
    group, gathered = Group(2), [None, None]

    def rank_main(r):
        adapter, comm = before[r]
        adapter.group = group               # gather_state is a collective: both threads take part
        gathered[r] = comm.gather_state()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert np.array_equal(gathered[0]["residuals"], gathered[1]["residuals"])
    Communication.write(tmp_path, gathered[0])
    saved = Communication.read(tmp_path)
    for rank, (_, comm) in enumerate(before):
        fresh = Communication(Config.from_dict({"compression": "topk", "topk_ratio": 0.1}), LeastSquares(None, rank), rank, 2, True)
        assert fresh.load(saved) is None
        assert np.array_equal(fresh.exchange.residual, comm.exchange.residual)
    other_world = Communication(Config.from_dict({"compression": "topk"}), LeastSquares(None, 0), 0, 4, True)
    assert "for 2 ranks" in other_world.load(saved) and other_world.exchange.residual is None
    assert Communication(Config.from_dict({"compression": "topk"}), LeastSquares(None, 0), 0, 2, True).load(None).startswith("the checkpoint has no")

