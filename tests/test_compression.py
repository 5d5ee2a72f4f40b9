"""The toolkit's gradient compressors on known tensors (numpy only, no framework, no MPI)."""
import numpy as np
import pytest

from toolkit import compression
from toolkit.compression import BF16, GradientExchange, Int8, TopK, payload_bytes


def data(n=10_000, seed=0):
    return np.random.RandomState(seed).randn(n).astype(np.float32) * 3


def test_bf16_round_trip_within_half_an_ulp():
    x = data()
    y = BF16().decompress(BF16().compress(x), len(x))
    assert np.all(np.abs(y - x) <= np.abs(x) * 2.0 ** -8)     # 8 significant bits: rel. error <= 2^-8
    assert BF16().compress(x)[0].dtype == np.uint16 and payload_bytes(BF16().compress(x)) == 2 * len(x)
    assert np.array_equal(BF16().decompress(BF16().compress(y), len(y)), y), "bf16 values are fixed points"


def test_int8_error_is_at_most_half_a_step_per_block():
    x = data(1000)
    q, scales = Int8().compress(x)
    assert q.dtype == np.int8 and len(q) == 1000 and len(scales) == 4      # ceil(1000 / 256) blocks
    y = Int8().decompress((q, scales), len(x))
    step = np.repeat(scales, compression.INT8_BLOCK)[:1000]
    assert np.all(np.abs(y - x) <= step / 2 + 1e-6)
    assert np.allclose(np.abs(x).reshape(-1)[:256].max(), 127 * scales[0])
    assert np.all(Int8().decompress(Int8().compress(np.zeros(10, np.float32)), 10) == 0)


@pytest.mark.parametrize("ratio", [0.01, 0.001, 0.25, 1.0])
def test_topk_keeps_exactly_the_k_largest_magnitudes(ratio):
    x = data()
    np.random.RandomState(1).shuffle(x)
    topk = TopK(ratio)
    y = topk.decompress(topk.compress(x), len(x))
    k = topk.k(len(x))
    kept = set(np.nonzero(y)[0])
    assert len(kept) == k
    assert kept == set(np.argsort(-np.abs(x))[:k])
    assert np.all(np.abs(y[list(kept)] - x[list(kept)]) <= np.abs(x[list(kept)]) * 2.0 ** -8)  # bf16 values


@pytest.mark.parametrize("ratio, width", [(3 / 100_000, np.uint16), (0.01, np.uint8)])
def test_topk_positions_bridge_long_gaps(ratio, width):
    x = np.zeros(100_000, np.float32)
    x[[0, 70_000, 99_999]] = [5, -6, 7]                 # gaps over 255 and over 65535
    topk = TopK(ratio)
    payload = topk.compress(x)
    assert payload[0].dtype == width
    assert np.array_equal(topk.decompress(payload, len(x)), x)


@pytest.mark.parametrize("ratio, at_most", [(0.01, 1 / 100), (0.001, 1 / 800)])
def test_topk_sends_about_ratio_of_the_dense_bytes(ratio, at_most):
    x = data(100_000)
    assert payload_bytes(TopK(ratio).compress(x)) <= x.nbytes * at_most


@pytest.mark.parametrize("compressor", [BF16(), Int8(), TopK(0.01)], ids=lambda c: c.name)
def test_error_feedback_residual_plus_sent_is_the_input(compressor):
    ex = GradientExchange(compressor, error_feedback=True)
    grads = [data(300, seed=s).reshape(20, 15) for s in range(3)]
    sent_total = np.zeros(300, np.float64)
    for g in grads:
        sent_total += ex.exchange([g], comm=None, world_size=1)[0].reshape(-1)
    # everything given so far = everything sent + what is still held back
    assert np.allclose(sent_total + ex.residual, sum(g.reshape(-1) for g in grads).astype(np.float64), atol=1e-5)
    assert np.abs(ex.residual).max() > 0


def test_without_error_feedback_nothing_is_kept():
    ex = GradientExchange(TopK(0.01), error_feedback=False)
    ex.exchange([data(500)], comm=None, world_size=1)
    assert ex.residual is None


def test_exchange_counts_the_payload_and_its_header():
    ex = GradientExchange(TopK(0.01), error_feedback=True)
    x = data(100_000)
    ex.exchange([x], comm=None, world_size=1)
    assert ex.last_bytes == payload_bytes(TopK(0.01).compress(x)) + 2 * 4     # two int32 part lengths
