"""`toolkit plan`'s cost model (toolkit/planner/scaling.py, toolkit/exchange/wire.py) on known inputs, its
calibration fit (toolkit/planner/calibration.py), what it records of the toolkit's own exchanges
(toolkit/planner/plan.py), and the command's bad input."""
import json
import math
import random
from dataclasses import replace

import pytest

from tests.conftest import one_line_error, toolkit
from toolkit.errors import ToolkitError
from toolkit.exchange import wire
from toolkit.planner import calibration, scaling, units

MB = 1e6
LINK = wire.Link(alpha=10e-6, bandwidth=1e9)      # 10 us a message, 1 GB/s


def test_ring_allreduce_at_two_and_eight_ranks():
    s = 100 * MB
    # N=2: 2 messages of S/2 each way; N=8: 14 messages, 2 * 7/8 of S through each link
    assert wire.ring_allreduce(s, 2, LINK) == pytest.approx(2 * 10e-6 + s / 1e9)
    assert wire.ring_allreduce(s, 8, LINK) == pytest.approx(14 * 10e-6 + 1.75 * s / 1e9)
    assert wire.ring_allreduce(s, 1, LINK) == 0
    # the bandwidth term approaches 2 S / bandwidth, the latency term grows with N
    big = wire.ring_allreduce(s, 1024, LINK)
    assert big - 2046 * 10e-6 == pytest.approx(2 * 1023 / 1024 * s / 1e9)


def test_allgather_grows_with_ranks_broadcast_with_log():
    s = 1 * MB
    costs = [wire.ring_allgather(s, n, LINK) for n in (2, 3, 5, 9)]
    assert costs == pytest.approx([(n - 1) * (10e-6 + s / 1e9) for n in (2, 3, 5, 9)])
    assert costs[3] / costs[0] == pytest.approx(8)          # linear in N-1, unlike an allreduce
    assert wire.tree_broadcast(s, 8, LINK) == pytest.approx(3 * (10e-6 + s / 1e9))
    assert wire.tree_broadcast(s, 9, LINK) == pytest.approx(4 * (10e-6 + s / 1e9))


def test_hierarchical_against_flat():
    inter, intra = wire.Link(5e-6, 25e9 / 8), wire.Link(2e-6, 300e9)
    cluster = scaling.Cluster(8, inter, intra)
    s, n = 100 * MB, 512                                 # 64 nodes of 8
    flat = cluster.allreduce(s, n)
    assert flat == pytest.approx(wire.ring_allreduce(s, n, inter))
    within = 7 * 2e-6 + 7 / 8 * s / 300e9
    assert cluster.hierarchical_allreduce(s, n) == pytest.approx(2 * within + 126 * 5e-6 + 2 * 63 / 64 * s * 8 / 25e9)
    assert cluster.hierarchical_allreduce(s, n) < flat
    # within one node both are the intra-node ring (no inter-node term)
    assert cluster.allreduce(s, 8) == pytest.approx(wire.ring_allreduce(s, 8, intra))
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
                exact = calibration.Sample(kind, n, size, 1.0)
                seconds = truth.cost(*exact.terms()) * (1 + rng.uniform(-noise, noise))
                samples.append(calibration.Sample(kind, n, size, seconds))
    return samples


def test_calibration_fits_synthetic_alpha_and_beta_within_5_percent():
    truth = wire.Link(alpha=40e-6, bandwidth=1.2e9)
    link = calibration.fit(synthetic(truth))                         # 3% timing noise
    assert link.alpha == pytest.approx(truth.alpha, rel=0.05)
    assert link.bandwidth == pytest.approx(truth.bandwidth, rel=0.05)
    assert link.overhead < 0.05 * truth.alpha
    assert calibration.fit_error(link, synthetic(truth)) < 0.03
    # with Horovod's per-collective overhead as well (1 ms: its cycle and negotiation)
    truth = wire.Link(alpha=40e-6, bandwidth=1.2e9, overhead=1e-3)
    link = calibration.fit(synthetic(truth, noise=0.01))
    assert (link.alpha, link.bandwidth, link.overhead) == pytest.approx((40e-6, 1.2e9, 1e-3), rel=0.05)
    # one kind at one N: the overhead cannot be told from alpha, which carries it
    link = calibration.fit(synthetic(truth, kinds=("allreduce",), ranks=(2,), noise=0))
    assert link.overhead == 0 and link.alpha == pytest.approx(40e-6 + 1e-3 / 2)
    assert link.bandwidth == pytest.approx(1.2e9)
    with pytest.raises(ToolkitError, match="more than one message size"):
        calibration.fit([calibration.Sample("allreduce", 2, 1e6, 1.0), calibration.Sample("allreduce", 2, 1e6, 1.1)])


def test_calibration_learns_each_collective_kind_apart_and_the_plan_prices_with_it(tmp_path):
    """Allgather and alltoall timed at their own speeds (Gloo's allgather ~2.5x slower a byte than its allreduce
    here): `fit_kinds` finds each kind's link within 5%; a cluster given them prices a flat int8 allgather on the
    allgather's link (and a crossing scales them all with the link); `toolkit plan --calibration` reads them."""
    truths = {"allreduce": wire.Link(40e-6, 1.2e9, 1e-3), "allgather": wire.Link(60e-6, 0.48e9, 1e-3),
              "alltoall": wire.Link(50e-6, 0.8e9, 1e-3)}
    samples = [s for kind, truth in truths.items() for s in synthetic(truth, kinds=(kind,), noise=0.01)]
    kinds = calibration.fit_kinds(samples)
    assert set(kinds) == set(truths)
    for kind, truth in truths.items():
        assert kinds[kind].bandwidth == pytest.approx(truth.bandwidth, rel=0.05), kind
    work = scaling.Workload(compute_s=0.1, tensor_values=(1_000_000,) * 4)
    flat = scaling.Cluster(1, truths["allreduce"], wire.Link(1e-6, 300e9))
    calibrated = scaling.Cluster(1, truths["allreduce"], wire.Link(1e-6, 300e9), kinds)
    gathered = scaling.Method("int8", "exchange", collectives=(("allgather", 4e6),))
    assert scaling.step_time(work, gathered, calibrated, 4).step_s == pytest.approx(
        0.1 + wire.ring_allgather(4e6, 4, kinds["allgather"]))
    assert scaling.step_time(work, gathered, calibrated, 4).step_s > scaling.step_time(work, gathered, flat, 4).step_s
    halved = calibrated.with_bandwidth(4, truths["allreduce"].bandwidth / 2)
    assert halved.kinds["allgather"].bandwidth == pytest.approx(kinds["allgather"].bandwidth / 2)
    stand_in_bench(tmp_path, [[1024, 1024], [1024]])
    link = {"alpha": 40e-6, "bandwidth": 1.2e9, "overhead": 1e-3}
    (tmp_path / "cal.json").write_text(json.dumps({"inter": link, "kinds": {"allgather": {**link, "bandwidth": 0.48e9}}}))
    proc = toolkit("plan", "--bench", str(tmp_path), "--gpus", "2,4", "--gpus-per-node", "1", "--methods", "none,int8",
                   "--calibration", str(tmp_path / "cal.json"), "--compression-ms", "0", "--out", str(tmp_path / "p"),
                   timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "; allgather 3.84 Gbit/s" in proc.stdout, proc.stdout[:600]


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
    cluster = scaling.Cluster(4, wire.Link(5e-6, 1e9), wire.Link(1e-6, 1e11))
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
    # bf16/int8: the same recorded payload as a compressed allreduce from 3 workers on: an alltoall of
    # it and an allgather of 1/N of it; compress 1 + 1/N, decode 2 payloads; 2(N-1)/N of it on the wire
    reducible = replace(gathered, reducible=True)
    assert scaling.step_time(work, reducible, cluster, 2).step_s == scaling.step_time(work, gathered, cluster, 2).step_s
    eight = scaling.step_time(work, reducible, cluster, 8)
    assert eight.step_s == pytest.approx(0.1 + cluster.alltoall(4e6, 8) + cluster.allgather(4e6 / 8, 8)
                                         + 0.002 * (1 + 1 / 8) + 2 * 0.001)
    assert eight.bytes_per_step == 4e6 + 4e6 / 8 and eight.wire_bytes_per_step == pytest.approx(2 * 7 / 8 * 4e6)
    assert scaling.step_time(work, gathered, cluster, 8).wire_bytes_per_step == 7 * 4e6
    assert eight.step_s < cost.step_s


def test_the_hierarchical_exchange_is_priced_on_both_links():
    """int8 in two levels on 4 nodes of 8: inside a node a float32 alltoall of the gradient and an allgather of
    its 8th on the intra-node link; across, the 8th's compressed exchange among the 4 nodes on the inter-node
    link, which the node's 8 ranks share (each at an 8th of its bandwidth), its compression work on an 8th of the
    payload; on one node, or one GPU a node, it is the flat form."""
    work = scaling.Workload(compute_s=0.1, tensor_values=(1_000_000,) * 4)
    nodes = scaling.Cluster(8, wire.Link(5e-6, 25e9 / 8, overhead=1e-3), wire.Link(2e-6, 300e9))
    flat = scaling.Method("int8", "exchange", collectives=(("allgather", 4.1e6),), compress_s=0.008,
                          decode_s=0.004, reducible=True)
    hier = replace(flat, hierarchical=True)
    cost = scaling.step_time(work, hier, nodes, 32)
    dense, shard = 16e6, 4.1e6 / 8
    assert [(k, b, n) for k, b, n, _ in hier.calls(work, nodes, 32)] == [
        ("alltoall", dense, 8), ("allgather", dense / 8, 8), ("alltoall", shard, 4), ("allgather", shard / 4, 4)]
    shared = replace(nodes.inter, bandwidth=nodes.inter.bandwidth / 8)
    expected = (wire.pairwise_alltoall(dense, 8, nodes.intra) + wire.ring_allgather(dense / 8, 8, nodes.intra)
                + wire.pairwise_alltoall(shard, 4, shared) + wire.ring_allgather(shard / 4, 4, shared))
    assert cost.comm_s == pytest.approx(expected)
    assert cost.step_s == pytest.approx(0.1 + expected + 0.008 / 8 * (1 + 1 / 4) + 2 * 0.004 / 8)
    assert cost.bytes_per_step == pytest.approx(dense + dense / 8 + shard + shard / 4)
    assert cost.step_s < scaling.step_time(work, flat, nodes, 32).step_s
    for n in (8, 4):            # one node: flat
        assert scaling.step_time(work, hier, nodes, n).step_s == scaling.step_time(work, flat, nodes, n).step_s


def test_crossing_is_the_link_where_a_method_stops_paying():
    """The bandwidth below which int8's compressed allreduce beats none: equal steps there, int8
    faster below and slower above; a method that is always faster has no crossing below `high`."""
    work = scaling.Workload(0.1, (1_000_000,) * 4)
    nodes = scaling.Cluster(1, wire.Link(5e-6, 25e9 / 8, overhead=1e-3), wire.Link(1e-6, 300e9))
    none = scaling.Method("none", "horovod")
    int8 = scaling.Method("int8", "exchange", collectives=(("allgather", 4.1e6),), compress_s=0.01,
                          decode_s=0.005, reducible=True)
    cross = scaling.crossing(work, int8, none, nodes, 8)
    assert cross is not None and 1.25e5 < cross < 1e13

    def steps(bandwidth):
        c = scaling.with_bandwidth(nodes, 8, bandwidth)
        return scaling.step_time(work, int8, c, 8).step_s, scaling.step_time(work, none, c, 8).step_s
    assert steps(cross * 0.9)[0] < steps(cross * 0.9)[1] and steps(cross * 1.1)[0] > steps(cross * 1.1)[1]
    assert steps(cross)[0] == pytest.approx(steps(cross)[1], rel=1e-6)
    free = scaling.Method("free", "horovod", value_bytes=2)        # fp16: never slower than none
    assert scaling.crossing(work, free, none, nodes, 8) == 1e13
    assert scaling.crossing(work, none, free, nodes, 8) is None


# -- PyTorch DDP (methods ddp, ddp_fp16): fixed buckets instead of Horovod's cycles ---------------------

MiB = 2 ** 20
NODES = scaling.Cluster(8, wire.Link(5e-6, 25e9 / 8), wire.Link(2e-6, 300e9))     # the plan's defaults
DDP = scaling.Method("ddp", "ddp")
ONE_BUCKET = scaling.Method("ddp one bucket", "ddp", bucket_limits=(math.inf,))


def random_workloads(count, seed=7, **kw):
    """Models of 1 to 80 gradients from 4 bytes to 32 MiB, in backward order."""
    rng = random.Random(seed)
    for _ in range(count):
        values = tuple(rng.choice((1, 64, 4096, 2 ** 16, 2 ** 20, 2 ** 22)) * rng.randint(1, 8)
                       for _ in range(rng.randint(1, 80)))
        yield scaling.Workload(compute_s=rng.uniform(0.01, 0.3), tensor_values=values, **kw)


def test_ddp_buckets_follow_torchs_assignment():
    # in the order gradients become ready, a bucket closes once it holds its limit or more (it can end
    # above it): 1 MiB for the first, 25 MiB for every other; what is left is the last bucket
    assert scaling.DDP_BUCKET_LIMITS == (MiB, 25 * MiB)
    sizes = [0.5 * MiB, 0.6 * MiB, 10 * MiB, 20 * MiB, 30 * MiB, 1 * MiB]
    assert [list(b) for b in scaling.ddp_buckets(sizes)] == [[0, 1], [2, 3], [4], [5]]
    assert [list(b) for b in scaling.ddp_buckets(sizes, (math.inf,))] == [list(range(6))]
    assert [list(b) for b in scaling.ddp_buckets(sizes, (1,))] == [[i] for i in range(6)]
    # the buckets are reduced in order on one stream: the second waits for the first, not only for its gradients
    cost = lambda b: b                                    # noqa: E731  (a second a byte)
    assert scaling.ddp_comm_end([0.05, 0.01], [0.01, 0.02], cost) == pytest.approx(0.07)
    assert scaling.ddp_comm_end([0.01, 0.01], [0.01, 0.05], cost) == pytest.approx(0.06)


def test_the_overlapped_exchange_hides_what_fits_under_the_backward_pass():
    """torch's bf16/int8 in buckets beside the backward pass: the flat gradient cut every bucket's bytes through
    tensors, each bucket's exchange (its share of the collectives and compression work) starting once its last
    gradient is ready and the bucket before it started; only what runs past the pass adds to the step."""
    assert scaling.exchange_buckets([3.0, 3.0, 4.0], 4.0) == [(4.0, 1), (4.0, 2), (2.0, 2)]
    assert scaling.exchange_buckets([10.0], 4.0) == [(4.0, 0), (4.0, 0), (2.0, 0)]
    cluster = scaling.Cluster(1, wire.Link(1e-5, 1e9, overhead=1e-3), wire.Link(1e-5, 1e9))
    work = scaling.Workload(compute_s=0.3, tensor_values=(1_000_000,) * 8)      # 32 MB of float32, backward 0.2 s
    whole = scaling.Method("int8", "exchange", collectives=(("allgather", 8e6),), compress_s=0.004, decode_s=0.002,
                           reducible=True)
    overlapped = replace(whole, bucket_bytes=8e6)                                # 4 buckets of 2 gradients
    after = scaling.step_time(work, whole, cluster, 8)
    during = scaling.step_time(work, overlapped, cluster, 8)
    quarter = scaling.step_time(replace(work, tensor_values=(2_000_000,)), whole.part(0.25), cluster, 8)
    assert after.exposed_s == pytest.approx(after.comm_s + 0.004 * (1 + 1 / 8) + 2 * 0.002)
    # the first three buckets end long before the pass does: only the last one, ready at its end, shows
    assert during.exposed_s == pytest.approx(quarter.exposed_s) and during.exposed_s < after.exposed_s / 3
    # no backward pass to hide behind: the four buckets one after another, each paying its own latencies
    instant = scaling.step_time(replace(work, backward_fraction=0.0), overlapped, cluster, 8)
    assert instant.exposed_s == pytest.approx(4 * quarter.exposed_s) and instant.exposed_s > after.exposed_s


def test_plan_overlaps_torchs_compressed_exchange_only():
    """The plan's bf16/int8 rows run in buckets beside the backward pass on torch (as on a GPU, overlap unset, or
    overlap: true), after it with overlap: false and on TensorFlow and MXNet."""
    from toolkit.config import Config
    from toolkit.planner import plan
    shapes = [(256, 256), (256,)]
    for values, bucket in (({"framework": "torch"}, 25 * MiB), ({"framework": "torch", "compression": "int8", "overlap": True,
                                                                 "bucket_mb": 4},
                                                                4 * MiB),
                           ({"framework": "torch", "overlap": False}, 0.0), ({"framework": "tensorflow"}, 0.0),
                           ({"framework": "mxnet"}, 0.0)):
        methods = plan.methods(Config.from_dict(values), ["int8", "int8_hierarchical", "topk"], shapes, 0.0)
        assert [m.bucket_bytes for m in methods] == [bucket, bucket, 0.0], values


def test_ddp_on_a_free_link_costs_only_the_compute():
    free = scaling.Cluster(8, wire.Link(0.0, math.inf), wire.Link(0.0, math.inf))
    for work in random_workloads(20):
        for n in (2, 8, 64, 512):
            for method in (DDP, ONE_BUCKET, scaling.Method("ddp_fp16", "ddp", value_bytes=2)):
                cost = scaling.step_time(work, method, free, n)
                assert cost.step_s == pytest.approx(work.compute_s) and cost.exposed_s == pytest.approx(0)
        # Horovod's loop still waits for its next cycle after the last gradient: DDP has no cycle
        assert scaling.step_time(work, scaling.Method("none", "horovod"), free, 8).step_s > work.compute_s


def test_ddp_one_bucket_without_overlap_is_one_allreduce_after_the_backward_pass():
    for work in random_workloads(20):
        total = 4.0 * work.values
        big = scaling.Method("ddp", "ddp", bucket_limits=(2 * total,))     # one bucket bigger than the model
        late = replace(work, ready=(1.0,) * len(work.tensor_values))
        # ready in proportion to bytes (the last at the end of the pass), every gradient at the end, or no
        # backward pass to hide behind: one bucket waits for its last gradient, then the whole ring allreduce shows
        for w in (work, late, replace(work, backward_fraction=0.0)):
            for n in (2, 8, 64, 512):
                for method in (big, ONE_BUCKET):
                    cost = scaling.step_time(w, method, NODES, n)
                    assert cost.step_s == pytest.approx(w.compute_s + NODES.allreduce(total, n))
                    assert cost.comm_s == pytest.approx(NODES.allreduce(total, n))


def test_ddp_smaller_buckets_with_overlap_never_slower_on_a_slow_link():
    slow = scaling.Cluster(8, wire.Link(0.0, 1e8), wire.Link(0.0, 1e9))      # bandwidth-bound: no latency
    faster = 0
    for work in random_workloads(30):
        for n in (8, 64):
            buckets, one = (scaling.step_time(work, m, slow, n) for m in (DDP, ONE_BUCKET))
            assert buckets.step_s <= one.step_s * (1 + 1e-12)
            assert buckets.comm_s == pytest.approx(one.comm_s)                  # the same bytes, sent earlier
            faster += buckets.step_s < 0.99 * one.step_s
    assert faster >= 30                                                          # and often much earlier
    # with latency every bucket pays 2(N-1) messages: 100 small gradients, one a bucket, at 512 GPUs lose
    small = scaling.Workload(compute_s=0.1, tensor_values=(1000,) * 100)
    each = scaling.Method("ddp", "ddp", bucket_limits=(1,))
    one = scaling.step_time(small, ONE_BUCKET, NODES, 512).step_s
    assert scaling.step_time(small, each, NODES, 512).step_s > one + 0.3


def test_ddp_bytes_and_its_fp16_hook():
    from toolkit.config import Config
    from toolkit.planner import plan

    shapes = [(1024, 1024), (1024,), (10, 1024), (10,)]
    none, ddp, fp16 = plan.methods(Config(), ["none", "ddp", "ddp_fp16"], shapes, 0.0)
    assert (ddp.kind, ddp.engine, ddp.lossless, fp16.engine, fp16.lossless) == ("ddp", "native", True, "native", False)
    assert none.engine == "horovod" and ddp.bucket_limits == scaling.DDP_BUCKET_LIMITS
    for work in random_workloads(10):
        assert ddp.bytes_per_step(work) == none.bytes_per_step(work) == 4 * work.values
        assert fp16.bytes_per_step(work) == 2 * work.values
        assert scaling.step_time(work, fp16, NODES, 64).bytes_per_step == 2 * work.values
        # the hook halves each bucket's bytes, not the buckets (they are filled by float32 gradients)
        at_once = replace(work, backward_fraction=0.0)
        float32 = [4.0 * v for v in work.tensor_values]
        halves = [sum(float32[i] for i in b) / 2 for b in scaling.ddp_buckets(float32)]
        assert scaling.step_time(at_once, fp16, NODES, 64).exposed_s == pytest.approx(
            sum(NODES.allreduce(h, 64) for h in halves))


def test_ddp_pays_no_horovod_negotiation():
    # a calibrated link's per-collective overhead is Horovod's negotiation and cycle: DDP's NCCL ring has none
    link = wire.Link(5e-6, 25e9 / 8, overhead=2e-3)
    cluster = scaling.Cluster(8, link, wire.Link(2e-6, 300e9))
    work = scaling.Workload(compute_s=0.1, tensor_values=(1_000_000,) * 8, backward_fraction=0.0)
    total = 4.0 * work.values
    assert scaling.step_time(work, ONE_BUCKET, cluster, 64).exposed_s == pytest.approx(
        wire.ring_allreduce(total, 64, wire.Link(5e-6, 25e9 / 8)))
    assert cluster.allreduce(total, 64) == pytest.approx(
        wire.ring_allreduce(total, 64, wire.Link(5e-6, 25e9 / 8)) + 2e-3)             # Horovod's, with it


def test_the_recommendation_names_the_faster_engine():
    values = (1000,) * 100 + (2_000_000,) * 11
    none, hier = scaling.Method("none", "horovod"), scaling.Method("hierarchical", "horovod", reduce="hierarchical")
    # Horovod fuses whatever is ready each millisecond; DDP's last 25 MiB bucket waits for its last gradient
    plan = scaling.Plan(scaling.Workload(0.1, values), NODES, [none, DDP], [8, 64]).run()
    pick, why = plan.recommend()
    assert pick.name == "none" and pick.engine == "horovod"
    assert "; engine: horovod with none (9" in why and "over native (torch DDP) with ddp (" in why
    # a calibrated link whose every Horovod collective costs 5 ms more (its negotiation): DDP wins
    slow = scaling.Cluster(8, wire.Link(5e-6, 25e9 / 8, overhead=5e-3), wire.Link(2e-6, 300e9, overhead=5e-3))
    plan = scaling.Plan(scaling.Workload(0.1, values), slow, [none, hier, DDP], [8, 64]).run()
    pick, why = plan.recommend()
    assert pick.name == "ddp" and pick.engine == "native"
    assert "; engine: native (torch DDP) with ddp (" in why and "over horovod with " in why
    # a link that costs nothing: neither engine is faster
    free = scaling.Cluster(8, wire.Link(0.0, math.inf), wire.Link(0.0, math.inf))
    _, why = scaling.Plan(scaling.Workload(0.1, values), free, [none, DDP], [8]).run().recommend()
    assert "engine: either" in why
    # Horovod's methods alone: no engine to compare
    _, why = scaling.Plan(scaling.Workload(0.1, values), NODES, [none, hier], [64]).run().recommend()
    assert "engine" not in why


def stand_in_bench(folder, shapes=([1024, 1024], [1024], [10, 1024], [10])) -> None:
    """A bench.json `toolkit plan --bench` reads: one worker, 320 samples/s at batch 32, these gradient shapes."""
    bench = {"title": "a stand-in bench", "config": {"batch_size": 32},
             "rows": [{"workers": 1, "per_worker": 320.0, "shapes": [list(s) for s in shapes]}]}
    (folder / "bench.json").write_text(json.dumps(bench))


def test_plan_prints_and_writes_the_ddp_rows(tmp_path):
    stand_in_bench(tmp_path)
    proc = toolkit("plan", "--bench", str(tmp_path), "--gpus", "8,64", "--methods", "none,ddp,ddp_fp16",
                   "--compression-ms", "0", "--out", str(tmp_path / "plan"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    values = 1024 * 1024 + 1024 + 10 * 1024 + 10
    assert f"| ddp | {4 * values:,} | " in proc.stdout and f"| ddp_fp16 | {2 * values:,} | " in proc.stdout
    assert "engine: " in proc.stdout.splitlines()[-2]
    result = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert result["engines"] == {"none": "horovod", "ddp": "native", "ddp_fp16": "native"}
    assert [c["n"] for c in result["rows"]["ddp"]] == [8, 64] and result["engine"] in ("horovod", "native")
    assert result["rows"]["ddp"][0]["bytes_per_step"] == 4 * values


def test_plan_prices_the_hierarchical_rows_and_the_links_where_each_beats_fp16(tmp_path):
    """`toolkit plan` with fp16 among the methods prints a second crossing table against it and writes it;
    the hierarchical rows hand the float32 inside the node to collectives as well."""
    stand_in_bench(tmp_path)
    proc = toolkit("plan", "--bench", str(tmp_path), "--gpus", "8,64", "--methods", "none,fp16,int8,int8_hierarchical",
                   "--compression-ms", "0", "--out", str(tmp_path / "plan"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| beats none when the link is below |" in proc.stdout
    assert "| beats fp16 when the link is below |" in proc.stdout
    result = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert set(result["beats_fp16_below_bytes_per_s"]) == {"none", "int8", "int8 hierarchical"}
    flat, hier = result["rows"]["int8"], result["rows"]["int8 hierarchical"]
    assert hier[0]["bytes_per_step"] == flat[0]["bytes_per_step"]      # one node of 8: the flat form
    assert hier[1]["bytes_per_step"] > flat[1]["bytes_per_step"] and hier[1]["efficiency"] >= flat[1]["efficiency"]


@pytest.mark.parametrize("text, expected", [
    ("25gbit", 25e9 / 8), ("100Mbit/s", 100e6 / 8), ("10gbps", 10e9 / 8), ("300GB/s", 300e9), ("12.5GB", 12.5e9)])
def test_bandwidth_units(text, expected):
    assert units.parse_bandwidth(text, "--inter-node") == pytest.approx(expected)


def test_recorded_exchanges_match_their_payloads():
    pytest.importorskip("numpy")
    from toolkit.config import Config
    from toolkit.planner import plan

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
    assert topk.compress_s > 0 and topk.decode_s > 0     # each timed apart, never a negative difference clamped to 0
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
