"""The toolkit's gradient compression on known tensors, on every array namespace (toolkit/exchange/arrays.py):
numpy (TensorFlow's and MXNet's gradients, and the CPU fallback) and torch tensors (CPU here, CUDA
when a GPU is present). No MPI: collectives are simulated where a test needs ranks."""
import math
import threading

import numpy as np
import pytest

from toolkit.exchange import arrays, compression
from toolkit.exchange.compression import BF16, Int8, TopK, density, payload_bytes
from toolkit.exchange.exchanges import DGCExchange, GradientExchange, PowerSGDExchange


def namespaces():
    out = ["numpy"]
    try:
        import torch
        out.append("torch")
        if torch.cuda.is_available():
            out.append("cuda")
    except ImportError:
        pass
    return out


@pytest.fixture(params=namespaces())
def ops(request):
    if request.param == "numpy":
        return arrays.numpy_ops()
    return arrays.Torch("cuda" if request.param == "cuda" else "cpu")


def host(ops, x):
    return np.asarray(ops.to_numpy(x))


def data(ops, n=10_000, seed=0):
    return ops.from_numpy(np.random.RandomState(seed).randn(n).astype(np.float32) * 3)


def test_bf16_round_trip_within_half_an_ulp(ops):
    x = data(ops)
    payload = BF16(ops).compress(x)
    y = BF16(ops).decompress(payload, len(x))
    hx, hy = host(ops, x), host(ops, y)
    assert np.all(np.abs(hy - hx) <= np.abs(hx) * 2.0 ** -8)     # 8 significant bits: rel. error <= 2^-8
    assert payload_bytes(payload) == 2 * len(x)
    assert np.array_equal(host(ops, BF16(ops).decompress(BF16(ops).compress(y), len(y))), hy), "fixed points"


def test_bf16_is_the_same_on_every_namespace():
    """numpy's bit arithmetic rounds as torch's bfloat16 cast does (ranks could differ otherwise)."""
    torch_ops = pytest.importorskip("torch") and arrays.Torch("cpu")
    x = np.random.RandomState(3).randn(100_000).astype(np.float32) * 1e3
    a = arrays.numpy_ops().bf16_bits(x)
    b = torch_ops.to_numpy(torch_ops.bf16_bits(torch_ops.from_numpy(x)))
    assert np.array_equal(a, b)


def test_int8_is_the_same_on_every_namespace():
    """numpy's passes and torch's fused ones (max |x| in one reduction, dequantise-and-add in one
    addcmul) give the same int8 values and scales, with a short last block and an all-zero block."""
    torch_ops = pytest.importorskip("torch") and arrays.Torch("cpu")
    x = np.random.RandomState(4).randn(3 * 256 + 77).astype(np.float32) * 50
    x[256:512] = 0
    a = Int8(arrays.numpy_ops()).compress(x)
    b = [torch_ops.to_numpy(p) for p in Int8(torch_ops).compress(torch_ops.from_numpy(x))]
    assert all(np.array_equal(p, r) for p, r in zip(a, b))
    da = Int8(arrays.numpy_ops()).decompress(a, len(x))
    db = torch_ops.to_numpy(Int8(torch_ops).decompress(tuple(torch_ops.from_numpy(p) for p in b), len(x)))
    assert np.allclose(da, db, rtol=1e-6, atol=1e-6) and np.all(da[256:512] == 0)


def test_int8_error_is_at_most_half_a_step_per_block(ops):
    x = data(ops, 1000)
    q, scales = Int8(ops).compress(x)
    assert str(q.dtype).endswith("int8") and len(q) == 1000 and len(scales) == 4   # ceil(1000 / 256) blocks
    y = host(ops, Int8(ops).decompress((q, scales), len(x)))
    hx, hs = host(ops, x), host(ops, scales)
    step = np.repeat(hs, compression.INT8_BLOCK)[:1000]
    assert len(y) == 1000 and np.all(np.abs(y - hx) <= step / 2 + 1e-6)
    assert np.allclose(np.abs(hx)[:256].max(), 127 * hs[0])
    zeros = ops.zeros(10)
    assert np.all(host(ops, Int8(ops).decompress(Int8(ops).compress(zeros), 10)) == 0)


@pytest.mark.parametrize("ratio", [0.01, 0.001, 0.25, 1.0])
def test_topk_keeps_exactly_the_k_largest_magnitudes(ops, ratio):
    hx = np.random.RandomState(0).randn(10_000).astype(np.float32) * 3
    np.random.RandomState(1).shuffle(hx)
    topk = TopK(ratio, ops)
    y = host(ops, topk.decompress(topk.compress(ops.from_numpy(hx)), len(hx)))
    k = topk.k(len(hx))
    kept = np.nonzero(y)[0]
    assert len(kept) == k
    assert set(kept) == set(np.argsort(-np.abs(hx))[:k])
    assert np.all(np.abs(y[kept] - hx[kept]) <= np.abs(hx[kept]) * 2.0 ** -8)  # bf16 values


@pytest.mark.parametrize("ratio, width", [(3 / 100_000, "uint16"), (0.01, "uint8")])
def test_topk_positions_bridge_long_gaps(ops, ratio, width):
    hx = np.zeros(100_000, np.float32)
    hx[[0, 70_000, 99_999]] = [5, -6, 7]                 # gaps over 255 and over 65535
    topk = TopK(ratio, ops)
    payload = topk.compress(ops.from_numpy(hx))
    assert str(payload[0].dtype).endswith(width)
    assert np.array_equal(host(ops, topk.decompress(payload, len(hx))), hx)


@pytest.mark.parametrize("ratio, at_most", [(0.01, 1 / 100), (0.001, 1 / 800)])
def test_topk_sends_about_ratio_of_the_dense_bytes(ops, ratio, at_most):
    x = data(ops, 100_000)
    assert payload_bytes(TopK(ratio, ops).compress(x)) <= 100_000 * 4 * at_most


def exchanges(ops):
    return [GradientExchange(BF16(ops), True), GradientExchange(Int8(ops), True),
            GradientExchange(TopK(0.01, ops), True),
            DGCExchange(TopK(0.01, ops), True, momentum=0.9, target_ratio=0.01, warmup_epochs=0),
            PowerSGDExchange(compression.Compressor(ops), True, rank=2)]


@pytest.mark.parametrize("which", range(5), ids=["bf16", "int8", "topk", "dgc", "powersgd"])
def test_error_feedback_holds_back_what_was_not_sent(ops, which):
    """Everything given so far = everything sent + what is still held back (DGC: given = its
    accumulated velocity, so the check is on the momentum-corrected inputs u)."""
    ex = exchanges(ops)[which]
    grads = [data(ops, 600, seed=s).reshape(20, 30) for s in range(4)]
    sent, given, u = np.zeros(600), np.zeros(600), np.zeros(600)
    for g in grads:
        out = ex.exchange([g], comm=None, world_size=1)[0]
        sent += host(ops, out).reshape(-1)
        hg = host(ops, g).reshape(-1).astype(np.float64)
        u = 0.9 * u + hg if isinstance(ex, DGCExchange) else hg
        given += u
        if isinstance(ex, DGCExchange):
            u[host(ops, ex.compressor.positions)] = 0          # factor masking
            assert np.allclose(host(ops, ex.momentum_buffer), u, atol=1e-4)
    held = host(ops, ex.residual)
    assert np.allclose(sent + held, given, atol=1e-3)
    assert np.abs(held).max() > 1e-3, "something was held back"


def test_without_error_feedback_nothing_is_kept(ops):
    ex = GradientExchange(TopK(0.01, ops), error_feedback=False)
    ex.exchange([data(ops, 500)], comm=None, world_size=1)
    assert ex.residual is None


def test_powersgd_error_falls_with_the_rank(ops):
    """A 64 x 48 matrix of rank 8 plus noise: the rank-r approximation of one step (from a random
    Q, one power iteration) loses less as r grows, and nearly nothing at r = 8."""
    rng = np.random.RandomState(0)
    m = (rng.randn(64, 8) @ rng.randn(8, 48) + 0.01 * rng.randn(64, 48)).astype(np.float32)
    errors = []
    for r in (1, 2, 4, 8):
        ex = PowerSGDExchange(compression.Compressor(ops), False, rank=r)
        for _ in range(3):                                   # warm-started Q: power iterations
            out = host(ops, ex.exchange([ops.from_numpy(m)], None, 1)[0])
        errors.append(np.linalg.norm(out - m) / np.linalg.norm(m))
    assert errors == sorted(errors, reverse=True) and errors[0] > 5 * errors[-1], errors
    assert errors[-1] < 0.01


def test_powersgd_sends_small_tensors_whole(ops):
    ex = PowerSGDExchange(compression.Compressor(ops), True, rank=4)
    bias, small, big = data(ops, 10), data(ops, 8 * 8).reshape(8, 8), data(ops, 256 * 128).reshape(256, 128)
    out = ex.exchange([bias, small, big], None, 1)
    assert np.array_equal(host(ops, out[0]), host(ops, bias)) and np.array_equal(host(ops, out[1]), host(ops, small))
    assert [p[3] for p in ex.plan] == [False, False, True]     # 8x8 at r=4: 64 < 2*4*16, not worth it


class Ranks:
    """`world` threads exchanging through simulated collectives (numpy or torch buffers)."""

    def __init__(self, world, ops):
        self.world, self.ops, self.slots = world, ops, [None] * world
        self.barrier = threading.Barrier(world, timeout=30)

    def run(self, fn):
        out, errors = [None] * self.world, []

        def main(rank):
            try:
                out[rank] = fn(rank, Comm(self, rank))
            except BaseException as e:
                errors.append(e)
                self.barrier.abort()
        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.world)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        if errors:
            raise errors[0]
        return out


class Comm:
    def __init__(self, ranks, rank):
        self.ranks, self.rank = ranks, rank

    def _collective(self, array, combine):
        ranks = self.ranks
        ranks.slots[self.rank] = array
        ranks.barrier.wait()
        result = combine(list(ranks.slots))
        ranks.barrier.wait()
        return result

    def allgather(self, array):
        return self._collective(array, self.ranks.ops.cat)

    def alltoall(self, array, splits):
        def mine(slots):            # part `rank` of every rank's buffer, in rank order
            out = []
            for buf, parts in slots:
                start = sum(parts[:self.rank])
                out.append(buf[start:start + parts[self.rank]])
            return self.ranks.ops.cat(out)
        return self._collective((array, list(splits)), mine)

    def allreduce(self, array, average=True):
        def mean(xs):
            total = xs[0] * 1
            for x in xs[1:]:
                total = total + x
            return total / len(xs) if average else total
        return self._collective(array, mean)


@pytest.mark.parametrize("which", range(5), ids=["bf16", "int8", "topk", "dgc", "powersgd"])
def test_every_rank_gets_the_same_mean_bit_for_bit(ops, which):
    """Two ranks with different gradients: one exchange gives both the same result (bit for bit),
    within the method's error of the true mean for the dense-ish methods; bytes are counted."""
    grads = [np.random.RandomState(r).randn(300, 40).astype(np.float32) for r in range(2)]

    def rank_main(rank, comm):
        ex = exchanges(ops)[which]
        out = ex.exchange([ops.from_numpy(grads[rank])], comm, 2)[0]
        return host(ops, out), ex.last_bytes

    (a, bytes_a), (b, _) = Ranks(2, ops).run(rank_main)
    assert np.array_equal(a, b)
    assert bytes_a > 0
    if which in (0, 1):                                      # bf16, int8: close to the mean
        assert np.abs(a - (grads[0] + grads[1]) / 2).max() < 0.05


def _reduced(ops, name, **kw):
    ex = GradientExchange(BF16(ops) if name == "bf16" else Int8(ops), True, **kw)
    ex.form, ex.chosen_for = "reduce", 0
    return ex


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("name", ["bf16", "int8"])
@pytest.mark.parametrize("n", [3, 1000, 7 * 256 + 5])          # fewer values than ranks; sizes N does not divide
def test_compressed_allreduce_gives_every_rank_the_same_mean(ops, world, name, n):
    """The compressed allreduce (alltoall of N compressed chunks, reduce, allgather of the reduced
    chunks): bit-identical on every rank, within two quantisations of the true mean, and a rank hands
    over its compressed payload plus its reduced chunk: 2(N-1)/N of the compressed size on the wire."""
    from toolkit.exchange import wire
    grads = [np.random.RandomState(r).randn(n).astype(np.float32) * 3 for r in range(world)]

    def rank_main(rank, comm):
        ex = _reduced(ops, name)
        out = ex.exchange([ops.from_numpy(grads[rank])], comm, world)[0]
        return host(ops, out).copy(), list(ex.calls), ex.chunks(n, world)

    results = Ranks(world, ops).run(rank_main)
    assert all(np.array_equal(results[0][0], r[0]) for r in results[1:])
    mean = sum(grads) / world
    step = np.abs(mean).max() / 127 if name == "int8" else np.abs(mean).max() / 128
    assert np.abs(results[0][0] - mean).max() <= 2 * step + 1e-6
    chunks = results[0][2]
    assert chunks[0][0] == 0 and chunks[-1][1] == n and all(a <= e for a, e in chunks)
    if name == "int8":
        assert all(a % 256 == 0 for a, _ in chunks)                # chunk starts are whole scale blocks
    per_value = 1 if name == "int8" else 2
    compressed = n * per_value + (4 * math.ceil(n / 256) if name == "int8" else 0)
    for rank, (_, calls, _) in enumerate(results):
        (kind1, sent), (kind2, reduced) = calls
        assert (kind1, kind2) == ("alltoall", "allgather")
        assert compressed <= sent <= compressed + 8 * 2 * world          # every chunk's parts padded to 8 bytes
        a, e = chunks[rank]
        size = (e - a) * per_value + (4 * math.ceil((e - a) / 256) if name == "int8" else 0)
        assert size <= reduced <= size + 16
    if n >= 1000:
        total = sum(wire.sent(k, b, world) for k, b in results[0][1])
        assert total == pytest.approx(2 * (world - 1) / world * compressed, rel=0.35 if world == 4 else 0.2)


@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_compressed_allreduce_error_feedback_covers_both_quantisations(ops, name):
    """Over steps: what every rank applied + the ranks' mean first residual + the owners' residuals of
    the second quantisation == the sum of the true means (nothing lost, only delayed)."""
    world, n, steps = 3, 1500, 4
    grads = [[np.random.RandomState(10 * t + r).randn(n).astype(np.float32) for r in range(world)] for t in range(steps)]

    def rank_main(rank, comm):
        ex = _reduced(ops, name)
        applied = np.zeros(n)
        for t in range(steps):
            applied += host(ops, ex.exchange([ops.from_numpy(grads[t][rank])], comm, world)[0])
        return applied, host(ops, ex.residual).copy(), host(ops, ex.owner_residual).copy(), ex.state()

    results = Ranks(world, ops).run(rank_main)
    true = sum(sum(g) / world for g in grads)
    first = sum(r[1] for r in results) / world
    second = sum(r[2] for r in results)           # each owner's chunk, zero elsewhere
    assert np.allclose(results[0][0] + first + second, true, atol=1e-4)
    assert np.abs(second).max() > 1e-4, "the second quantisation's error is kept"
    assert all(set(r[3]) == {"residuals", "owner_residuals"} for r in results)     # both in the checkpoint


def test_the_allgather_stays_at_two_ranks_and_the_compressed_allreduce_runs_above():
    from toolkit.exchange import wire
    for payload in (1e3, 1e6, 1e8):
        assert wire.exchange_form(2, payload) == "allgather"
    assert wire.exchange_form(3, 100) == wire.exchange_form(64, 1e8) == "reduce"


def test_bytes_are_zero_at_world_size_one(ops):
    for ex in exchanges(ops):
        ex.exchange([data(ops, 4000).reshape(40, 100)], None, 1)
        assert ex.last_bytes == 0, type(ex).__name__


def test_powersgd_bytes_are_its_factors(ops):
    def rank_main(rank, comm):
        ex = PowerSGDExchange(compression.Compressor(ops), True, rank=2)
        ex.exchange([data(ops, 300 * 40, seed=rank).reshape(300, 40), data(ops, 40, seed=rank)], comm, 2)
        return ex.last_bytes
    assert Ranks(2, ops).run(rank_main)[0] == 4 * (300 * 2 + 40 + 40 * 2)    # P, the bias, Q


def test_dgc_density_warms_up_from_a_quarter():
    assert density(0.001, 0, 4) == 0.25
    # the paper's schedule for 0.1% over 4 epochs: 25%, 6.25%, 1.5625%, 0.4%, then 0.1%
    assert [density(0.001, e, 4) for e in range(6)] == pytest.approx([0.25, 0.0625, 0.015625, 0.004, 0.001, 0.001],
                                                                     rel=0.02)
    assert density(0.01, 0, 0) == 0.01 and density(0.5, 0, 4) == 0.5


def test_dgc_clips_each_ranks_gradient_to_norm_over_sqrt_n(ops):
    ex = DGCExchange(TopK(1.0, ops), True, momentum=0.0, clip_norm=2.0, target_ratio=1.0, warmup_epochs=0)
    g = data(ops, 1000)
    out = host(ops, ex.exchange_flat(g, _Solo(ops), 4))      # four equal ranks: the mean is one rank's
    assert abs(np.linalg.norm(out) - 2.0 / 2) < 1e-2            # clipped to 2 / sqrt(4)


class _Solo:
    """Four ranks that all send the same payload."""

    def __init__(self, ops):
        self.ops = ops

    def allgather(self, array):
        return self.ops.cat([array] * 4)


@pytest.mark.parametrize("spiky", [False, True], ids=["sampled-threshold", "fallback"])
def test_topk_on_a_large_buffer_is_still_exactly_the_k_largest(ops, spiky):
    """Over 4 x SAMPLE values the threshold comes from a strided sample; the result must still be the
    exact top-k, also when the sample misleads (spiky: every sampled value large, so fewer than k
    values pass the threshold and the exact selection runs)."""
    n = 1_000_000
    hx = np.random.RandomState(5).randn(n).astype(np.float32)
    if spiky:
        hx[::n // compression.SAMPLE] *= 1000
    topk = TopK(0.01, ops)
    got = np.sort(host(ops, topk.select(ops.from_numpy(hx))))
    assert np.array_equal(got, np.sort(np.argsort(-np.abs(hx), kind="stable")[:10_000]))


@pytest.mark.parametrize("rank", [1, 2])
def test_powersgd_matches_torchs_ddp_hook(rank, tmp_path):
    """The same gradients through torch DDP's powerSGD_hook (one process, Gloo) and through the
    toolkit's PowerSGD (numpy), from the same first Q: equal to float rounding over 5 compressed
    steps with error feedback and warm start (the hook allreduces whole for its first 2 steps)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        def make():
            return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                       torch.nn.Linear(16 * 6 * 6, 10))
        net, plain = make(), make()
        plain.load_state_dict(net.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=100)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                                            random_seed=0)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        ex = PowerSGDExchange(compression.Compressor(), True, rank=rank)
        worst = 0.0
        for step in range(7):
            x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
            for model in (ddp, plain):
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
            theirs = [p.grad.numpy().copy() for p in net.parameters()]
            grads = [p.grad.numpy().copy() for p in plain.parameters()]
            if step < 2:
                continue
            if step == 2:       # the hook's first Q: one seeded draw per matrix, in the bucket's (reversed) order
                ex._make_plan(grads)
                q = np.zeros(len(ex.q), np.float32)
                torch.manual_seed(np.random.RandomState(0).randint(1_000_000_000))
                for _, _, cols, compressed, at in reversed(ex.plan):
                    if compressed:
                        q[at:at + cols * rank] = torch.randn(1, cols, rank).numpy().reshape(-1)
                ex.q = q
            ours = ex.exchange(grads, None, 1)
            worst = max(worst, *(float(np.abs(a - b).max()) for a, b in zip(theirs, ours)))
            assert np.abs(theirs[0] - grads[0]).max() > 1e-3, "the hook compressed the conv weight"
        assert worst < 1e-5
    finally:
        dist.destroy_process_group()
