"""`toolkit plan`'s cost model (toolkit/planner/scaling.py) on known inputs, its calibration fit, what it records
of the toolkit's own exchanges (toolkit/planner/plan.py), and the command's bad input."""
import math
import random

import pytest

from tests.conftest import one_line_error, toolkit
from toolkit.planner import scaling

MB = 1e6
LINK = scaling.Link(alpha=10e-6, bandwidth=1e9)      # 10 us a message, 1 GB/s


def test_ring_allreduce_at_two_and_eight_ranks():
    s = 100 * MB
    # N=2: 2 messages of S/2 each way; N=8: 14 messages, 2 * 7/8 of S through each link
    assert scaling.ring_allreduce(s, 2, LINK) == pytest.approx(2 * 10e-6 + s / 1e9)
    assert scaling.ring_allreduce(s, 8, LINK) == pytest.approx(14 * 10e-6 + 1.75 * s / 1e9)
    assert scaling.ring_allreduce(s, 1, LINK) == 0
    # the bandwidth term approaches 2 S / bandwidth, the latency term grows with N
    big = scaling.ring_allreduce(s, 1024, LINK)
    assert big - 2046 * 10e-6 == pytest.approx(2 * 1023 / 1024 * s / 1e9)


def test_allgather_grows_with_ranks_broadcast_with_log():
    s = 1 * MB
    costs = [scaling.ring_allgather(s, n, LINK) for n in (2, 3, 5, 9)]
    assert costs == pytest.approx([(n - 1) * (10e-6 + s / 1e9) for n in (2, 3, 5, 9)])
    assert costs[3] / costs[0] == pytest.approx(8)          # linear in N-1, unlike an allreduce
    assert scaling.tree_broadcast(s, 8, LINK) == pytest.approx(3 * (10e-6 + s / 1e9))
    assert scaling.tree_broadcast(s, 9, LINK) == pytest.approx(4 * (10e-6 + s / 1e9))


def test_hierarchical_against_flat():
    inter, intra = scaling.Link(5e-6, 25e9 / 8), scaling.Link(2e-6, 300e9)
    cluster = scaling.Cluster(8, inter, intra)
    s, n = 100 * MB, 512                                 # 64 nodes of 8
    flat = cluster.allreduce(s, n)
    assert flat == pytest.approx(scaling.ring_allreduce(s, n, inter))
    within = 7 * 2e-6 + 7 / 8 * s / 300e9
    assert cluster.hierarchical_allreduce(s, n) == pytest.approx(2 * within + 126 * 5e-6 + 2 * 63 / 64 * s * 8 / 25e9)
    assert cluster.hierarchical_allreduce(s, n) < flat
    # within one node both are the intra-node ring (no inter-node term)
    assert cluster.allreduce(s, 8) == pytest.approx(scaling.ring_allreduce(s, 8, intra))
    assert cluster.hierarchical_allreduce(s, 8) == pytest.approx(2 * within)
    # latency-bound small messages: hierarchical pays 2*63 inter-node alphas instead of 2*511
    tiny = 1e3
    assert cluster.allreduce(tiny, n) - cluster.hierarchical_allreduce(tiny, n) > 380 * 5e-6


def synthetic(truth, kinds=("allreduce", "allgather"), ranks=(2, 3, 4), noise=0.03, seed=3):
    rng = random.Random(seed)
    samples = []
    for kind in kinds:
        for n in ranks:
            for size in (1e3, 16e3, 256e3, 4e6, 64e6):
                exact = scaling.Sample(kind, n, size, 1.0)
                samples.append(scaling.Sample(kind, n, size, truth.cost(*exact.terms()) * (1 + rng.uniform(-noise, noise))))
    return samples


def test_calibration_fits_synthetic_alpha_and_beta_within_5_percent():
    truth = scaling.Link(alpha=40e-6, bandwidth=1.2e9)
    link = scaling.fit(synthetic(truth))                         # 3% timing noise
    assert link.alpha == pytest.approx(truth.alpha, rel=0.05)
    assert link.bandwidth == pytest.approx(truth.bandwidth, rel=0.05)
    assert link.overhead < 0.05 * truth.alpha
    assert scaling.fit_error(link, synthetic(truth)) < 0.03
    # with Horovod's per-collective overhead as well (1 ms: its cycle and negotiation)
    truth = scaling.Link(alpha=40e-6, bandwidth=1.2e9, overhead=1e-3)
    link = scaling.fit(synthetic(truth, noise=0.01))
    assert (link.alpha, link.bandwidth, link.overhead) == pytest.approx((40e-6, 1.2e9, 1e-3), rel=0.05)
    # one kind at one N: the overhead cannot be told from alpha, which carries it
    link = scaling.fit(synthetic(truth, kinds=("allreduce",), ranks=(2,), noise=0))
    assert link.overhead == 0 and link.alpha == pytest.approx(40e-6 + 1e-3 / 2)
    assert link.bandwidth == pytest.approx(1.2e9)
    with pytest.raises(scaling.ToolkitError, match="more than one message size"):
        scaling.fit([scaling.Sample("allreduce", 2, 1e6, 1.0), scaling.Sample("allreduce", 2, 1e6, 1.1)])


def test_overlap_fusion_and_cycles():
    cost = lambda b: 1e-3 + b / 1e9                       # noqa: E731
    tick = 0.5e-3                                         # Horovod's 1 ms cycles, ticking half a cycle in
    # one gradient, ready when the backward pass ends: all of its reduction shows, from the next tick
    assert scaling.horovod_comm_end([1e6], 0.1, cost, 64e6, 1e-3) == pytest.approx(0.1 + tick + cost(1e6))
    # ten equal gradients through a 100 ms pass, each reduction 2 ms: all but the last hide
    end = scaling.horovod_comm_end([1e6] * 10, 0.1, cost, 64e6, 1e-3)
    assert 0.1 + cost(1e6) <= end < 0.1 + 2 * cost(1e6)
    # no fusion: every gradient alone; with everything ready at once, fusion sends one buffer
    assert scaling.horovod_comm_end([1e6] * 10, 0.0, cost, 0, 1e-3) == pytest.approx(tick + 10 * cost(1e6))
    assert scaling.horovod_comm_end([1e6] * 10, 0.0, cost, 64e6, 1e-3) == pytest.approx(tick + cost(10e6))
    assert scaling.horovod_comm_end([1e6] * 10, 0.0, cost, 3e6, 1e-3) == pytest.approx(tick + 3 * cost(3e6) + cost(1e6))
    # a longer cycle time delays the last reduction to the next tick
    assert scaling.horovod_comm_end([1e6], 0.1, cost, 64e6, 5e-3) == pytest.approx(0.1025 + cost(1e6))
    # a big gradient ready early (VGG's fully connected layers: most bytes, little compute) hides behind
    # the pass; ready in proportion to bytes it would come at 90% of the pass and show
    big = [90e6, 10e6]
    early = scaling.horovod_comm_end(big, 0.1, cost, 64e6, 1e-3, ready_fractions=[0.01, 1.0])
    late = scaling.horovod_comm_end(big, 0.1, cost, 64e6, 1e-3)
    assert early == pytest.approx(0.1 + tick + cost(10e6))
    assert late == pytest.approx(0.09 + tick + cost(90e6) + cost(10e6))


def test_step_time_stragglers_and_methods():
    cluster = scaling.Cluster(4, scaling.Link(5e-6, 1e9), scaling.Link(1e-6, 1e11))
    work = scaling.Workload(compute_s=0.1, tensor_values=(1_000_000,) * 4)
    none = scaling.Method("none", "horovod")
    one = scaling.step_time(work, none, cluster, 1)
    assert one.step_s == 0.1 and one.efficiency == 1 and one.bytes_per_step == 0
    eight = scaling.step_time(work, none, cluster, 8)
    assert eight.bytes_per_step == 16e6 and eight.step_s > 0.1
    # overlap: three of the four gradients are reduced while the backward pass runs; the last shows
    assert eight.exposed_s < 0.5 * eight.comm_s and eight.step_s == pytest.approx(0.1 + eight.exposed_s)
    # stragglers: the slowest of N (expected max of N standard normals: 1.42 at N=8)
    late = scaling.step_time(scaling.Workload(0.1, (1_000_000,) * 4, straggle=0.1), none, cluster, 8)
    assert late.step_s - eight.step_s == pytest.approx(0.1 * 0.1 * scaling.expected_max_normal(8))
    assert scaling.expected_max_normal(8) == pytest.approx(1.4236, rel=0.01)
    # fp16 halves the bytes; an allgathered method pays N-1 payloads and N decodes, after the pass
    gathered = scaling.Method("int8", "exchange", collectives=(("allgather", 4e6),), compress_s=0.002, decode_s=0.001)
    cost = scaling.step_time(work, gathered, cluster, 8)
    assert cost.step_s == pytest.approx(0.1 + cluster.allgather(4e6, 8) + 0.002 + 8 * 0.001)
    local = scaling.Method("local", "local_sgd", local_steps=4)
    assert scaling.step_time(work, local, cluster, 8).comm_s == pytest.approx(cluster.allreduce(4 * 8e6, 8) / 4)


@pytest.mark.parametrize("text, expected", [
    ("25gbit", 25e9 / 8), ("100Mbit/s", 100e6 / 8), ("10gbps", 10e9 / 8), ("300GB/s", 300e9), ("12.5GB", 12.5e9)])
def test_bandwidth_units(text, expected):
    assert scaling.parse_bandwidth(text, "--inter-node") == pytest.approx(expected)


def test_recorded_exchanges_match_their_payloads():
    pytest.importorskip("numpy")
    from toolkit.planner import plan
    from toolkit.config import Config

    shapes = [(64, 32), (32,), (10, 32), (10,)]          # 2410 values
    n = sum(math.prod(s) for s in shapes)
    cfg = Config()
    int8 = plan.record(cfg, "int8", shapes, compression_s=0.0)
    # one allgather: n int8 values and ceil(n / 256) float32 scales, each part padded to 8 bytes
    assert int8.collectives == (("allgather", n + -n % 8 + 4 * math.ceil(n / 256) + -4 * math.ceil(n / 256) % 8),)
    topk = plan.record(cfg, "topk", shapes, compression_s=None, rounds=1)
    k = math.ceil(0.01 * n)
    assert topk.name == "topk 0.01" and [c for c, _ in topk.collectives] == ["allgather", "allgather"]
    assert topk.collectives[0][1] == 8 and topk.collectives[1][1] >= 3 * k      # lengths, then gaps + bf16 values
    assert topk.compress_s > 0
    # PowerSGD rank 1: P (64 + 10 rows) with the vectors whole, then Q (32 + 32 columns): float32
    psgd = plan.record(cfg, "powersgd", shapes, compression_s=0.0)
    assert psgd.collectives == (("allreduce", 4 * (64 + 10 + 32 + 10)), ("allreduce", 4 * (32 + 32)))


@pytest.mark.parametrize("flags, needles", [
    (["--inter-node", "25gibberish"], ["--inter-node '25gibberish'", "25gbit"]),
    (["--latency", "5"], ["--latency '5'", "5us"]),
    (["--gpus", "0,8"], ["--gpus '0,8'", "at least 1"]),
    (["--gpus", "4,8", "--gpus-per-node", "16"], ["--gpus-per-node 16", "larger than the largest --gpus (8)"]),
    (["--methods", "none,zip"], ["--methods 'none,zip'", "zip"]),
    (["--step-ms", "0"], ["--step-ms 0"]),
])
def test_plan_bad_input(flags, needles, tmp_path):
    one_line_error(toolkit("plan", "--out", str(tmp_path), *flags, timeout=60), *needles)
