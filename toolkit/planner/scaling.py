"""The cost of one data-parallel training step at N workers: an alpha-beta model, framework-free.

Each collective is priced on a link as toolkit/exchange/wire.py says (alpha + bytes / bandwidth a
message, plus a fixed overhead a collective: Horovod's negotiation and cycle, which the calibration
fit finds: toolkit/planner/calibration.py), by the ring algorithms of NCCL, Gloo and Open MPI.
With ranks placed node by node, a ring crosses each node's network link once each way, so a ring
that spans nodes runs at the inter-node link's cost; within one node, at the intra-node link's.
Hierarchical allreduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE) reduce-scatters within each node,
allreduces across the nodes (the node's G shards side by side, S bytes through its link in all) and
allgathers within the node. Adasum (Maleki et al. 2021; Horovod's on GPUs) reduces within the node,
then combines across nodes by recursive vector halving and distance doubling: 2 log2(M) alphas.

A step (`step_time`) is one worker's compute (forward, backward, optimizer: measured at one worker)
plus the part of the communication that does not hide behind the backward pass:
- Horovod's path (none, fp16, hierarchical, adasum): gradients become ready during the backward
  pass, last layer first, when the pass has done the compute that precedes them (`ready_times`,
  from `Workload.ready`; unknown, in proportion to their bytes, which is late for big cheap layers
  such as VGG's fully connected ones); Horovod's background loop wakes every cycle
  time, fuses the ready gradients into buffers of up to the fusion threshold and reduces them one
  after another (`horovod_comm_end`), so only what is still being sent when the backward pass ends
  adds to the step.
- PyTorch DDP's path (ddp, ddp_fp16: the torch backend `native`): the same gradients ready at the
  same times, in fixed buckets instead of Horovod's cycles (`ddp_buckets`: in the order the
  gradients become ready, a bucket closes once it holds its limit or more: 1 MiB for the first,
  `bucket_cap_mb` = 25 MiB for the rest, float32 bytes); a bucket's ring allreduce starts once its
  last gradient is ready and the bucket before it has started, and one communication stream runs
  them in order (`ddp_comm_end`). No cycle, no negotiation (a calibrated link's per-collective
  overhead, fitted on Horovod's collectives, is left out), no copy into a fusion buffer (nor
  Horovod's copy, which the model leaves out too). The fp16/bf16 communication hooks send each
  bucket in 2 bytes a value.
- The toolkit's exchange (topk: allgathers; bf16, int8: the compressed allreduce from 3 workers on,
  an alltoall of the payload and an allgather of 1/N of it, else an allgather: `exchange_form`;
  powersgd: two allreduces) runs after the backward pass on all gradients at once, plus its
  compression work (`exchange_work`: compress once, decompress and add every rank's payload: N times
  for the allgathered methods; twice a payload's worth for the compressed allreduce).
- Local SGD averages the model (parameters and optimizer slots) with one allreduce every k steps.
Stragglers: each worker's compute varies (coefficient of variation `straggle`); a synchronous step
waits for the slowest of N, whose expected excess over the mean is about `straggle` times the
expected maximum of N standard normals (Blom's approximation); local SGD waits once per k steps.

What the model leaves out: congestion between jobs, the loss averaged each step (a few bytes),
NCCL's tree algorithms for small messages, and the effect of a method on convergence (fewer bytes
can need more steps: docs/COMMUNICATION.md has the accuracies). docs/SCALING.md checks it against
measurements here and published results.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from toolkit.exchange import wire
from toolkit.exchange.wire import (
    HOROVOD_CYCLE_S,
    Link,
    exchange_form,
    exchange_work,
    pairwise_alltoall,
    ring_allgather,
    ring_allreduce,
)
from toolkit.planner.cluster import Cluster

COLLECTIVES = {"allreduce": ring_allreduce, "allgather": ring_allgather, "alltoall": pairwise_alltoall}
HOROVOD_FUSION_BYTES = 128 * 1024 * 1024   # Horovod 0.28.1's default (horovod/common/operations.cc)
# torch's DDP bucket limits: the first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES), then every other
# (bucket_cap_mb's default, 25 MiB), as torch/nn/parallel/distributed.py passes them to its Reducer
DDP_BUCKET_LIMITS = (1024 * 1024, 25 * 1024 * 1024)


# -- one step ----------------------------------------------------------------------------------------

def expected_max_normal(n: int) -> float:
    """E[max of n standard normals], Blom's approximation (within ~1% for n >= 2); 0 for n = 1."""
    if n <= 1:
        return 0.0
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def ready_times(tensor_bytes: list[float], backward_s: float, ready_fractions=None) -> list[float]:
    """When each gradient is ready, in seconds from the backward pass's start. `tensor_bytes`: each
    gradient's bytes, in the order the backward pass produces them, each ready at its
    `ready_fractions` of the pass (what share of the backward compute is done by then), or, without
    them, when the pass has done its share in proportion to bytes."""
    if ready_fractions:
        return [backward_s * f for f in ready_fractions]
    total, ready, acc = sum(tensor_bytes), [], 0.0
    for b in tensor_bytes:
        acc += b
        ready.append(backward_s * acc / total if total else backward_s)
    return ready


def horovod_comm_end(tensor_bytes: list[float], backward_s: float, reduce_cost, fusion_bytes: float,
                     cycle_s: float, ready_fractions: Sequence[float] | None = None) -> float:
    """When the last gradient has been reduced, in seconds from the backward pass's start.

    `tensor_bytes`: each gradient's bytes on the wire, ready as `ready_times` says. Horovod's loop starts a
    cycle at least `cycle_s` after the last one began and after its work ended (its phase against the
    step is arbitrary: the first tick half a cycle into the pass, the mean), fuses the gradients
    ready by then into buffers of up to `fusion_bytes` (one that is larger goes alone; 0: no fusion)
    and reduces the buffers one after another, `reduce_cost(bytes)` each."""
    if not tensor_bytes or sum(tensor_bytes) == 0:
        return 0.0
    ready = ready_times(tensor_bytes, backward_s, ready_fractions)
    start, end, i = -cycle_s / 2, 0.0, 0
    while i < len(tensor_bytes):
        start = max(start + cycle_s, end)
        if ready[i] > start:        # nothing ready: sleep whole cycles until something is
            start += cycle_s * math.ceil((ready[i] - start) / cycle_s) if cycle_s > 0 else ready[i] - start
        end = start
        buffer = 0.0
        while i < len(tensor_bytes) and ready[i] <= start:
            if buffer and buffer + tensor_bytes[i] > fusion_bytes:
                end += reduce_cost(buffer)
                buffer = 0.0
            buffer += tensor_bytes[i]
            i += 1
        end += reduce_cost(buffer)
    return end


def ddp_buckets(tensor_bytes: list[float], limits=DDP_BUCKET_LIMITS) -> list[range]:
    """DDP's buckets, as torch's Reducer rebuilds them after the first step (compute_bucket_assignment_by_size
    on the gradients in the order they became ready): each gradient joins the open bucket, which closes
    once it holds its limit or more (so a bucket can end above its limit); the first bucket's limit is
    `limits[0]`, the next one's the next, the last limit holds for all the rest. Each bucket is the
    range of the gradients' indices it holds."""
    out, start, size, k = [], 0, 0.0, 0
    for i, b in enumerate(tensor_bytes):
        size += b
        if size >= limits[k]:
            out.append(range(start, i + 1))
            start, size, k = i + 1, 0.0, min(k + 1, len(limits) - 1)
    return out + ([range(start, len(tensor_bytes))] if start < len(tensor_bytes) else [])


def ddp_comm_end(bucket_bytes: list[float], bucket_ready: list[float], reduce_cost) -> float:
    """When DDP's last bucket has been reduced, in seconds from the backward pass's start: bucket i's
    allreduce (`reduce_cost(bytes)`) is launched once its last gradient is ready (`bucket_ready`) and
    bucket i-1's was launched (its Reducer launches them in order), and the one communication
    stream runs them one after another."""
    end = 0.0
    for size, ready in zip(bucket_bytes, bucket_ready):
        end = max(end, ready) + reduce_cost(size)
    return end


@dataclass(frozen=True)
class Workload:
    compute_s: float                 # one worker's step without communication
    tensor_values: tuple             # each gradient's values, in the order the backward pass makes them
    backward_fraction: float = 2 / 3     # of compute_s (backward costs about twice the forward)
    straggle: float = 0.0            # coefficient of variation of one worker's compute time
    state_values: int = 0            # what local SGD averages (parameters + optimizer slots); 0: 2x gradients
    ready: tuple = ()                # each gradient's readiness, as a share of the backward pass done (same
                                     # order, nondecreasing); empty: in proportion to bytes (see horovod_comm_end)

    @property
    def values(self) -> int:
        return int(sum(self.tensor_values))


@dataclass(frozen=True)
class Method:
    """How a step's gradients travel. kind: 'horovod' (fused allreduces overlapped with the backward
    pass; `reduce` is allreduce, hierarchical or adasum), 'ddp' (PyTorch DDP: allreduces of fixed
    buckets overlapped with the backward pass), 'exchange' (the toolkit's, after the
    backward pass: `collectives` of (kind, bytes per rank)), or 'local_sgd' (model average every
    `local_steps`). `value_bytes`: bytes a gradient value on the wire (2: fp16, or DDP's fp16/bf16 hook)."""
    name: str
    kind: str
    value_bytes: float = 4.0
    reduce: str = "allreduce"
    fusion_bytes: float = HOROVOD_FUSION_BYTES
    cycle_s: float = HOROVOD_CYCLE_S
    bucket_limits: tuple = DDP_BUCKET_LIMITS      # kind 'ddp': the first bucket's limit, then every other's (bytes)
    collectives: tuple = ()           # ('allgather' | 'allreduce', bytes) for kind 'exchange'
    compress_s: float = 0.0           # compress once per step (exchange)
    decode_s: float = 0.0             # decompress and add one rank's whole payload
    reducible: bool = False           # bf16, int8: the allgather above or the compressed allreduce, the cheaper at N
    hierarchical: bool = False        # the exchange in two levels (toolkit/exchange/hierarchy.py) across nodes
    local_steps: int = 1
    lossless: bool = True             # same arithmetic as plain allreduce (up to summation order)
    note: str = ""

    @property
    def engine(self) -> str:
        """Which backend runs it: 'native' (torch DDP) for kind 'ddp'; 'horovod' for the rest (the
        toolkit's exchange and local SGD run on the Horovod backend's collectives)."""
        return "native" if self.kind == "ddp" else "horovod"

    def collectives_at(self, cluster: "Cluster", n: int) -> tuple:
        """The exchange's collectives at N workers: as recorded, or, for bf16 and int8 where the model
        prices the compressed allreduce cheaper (`exchange_form`), an alltoall of the whole payload and
        an allgather of one N-th of it."""
        if not self.reducible or exchange_form(n, self.collectives[0][1], cluster.ring_link(n), self.compress_s,
                                               self.decode_s) == "allgather":
            return self.collectives
        payload = self.collectives[0][1]
        return (("alltoall", payload), ("allgather", payload / n))

    def calls(self, workload: Workload, cluster: "Cluster", n: int) -> list[tuple[str, float, int, Link]]:
        """The exchange's collectives at N workers as (kind, bytes a rank hands over, ranks taking part,
        their link). Flat: `collectives_at`, among all N. Hierarchical across M nodes of G: a float32
        alltoall of the gradient and an allgather of its G-th among the node's G (the intra-node link),
        and the compressed exchange of the G-th among the M ranks of each local rank (the inter-node link,
        which the node's G ranks share: their G exchanges run at once through it, each at a G-th of its
        bandwidth, as Horovod's hierarchical allreduce sends the node's G shards side by side)."""
        if (levels := self.levels(cluster, n)) is None:
            return [(kind, b, n, cluster.ring_link(n, kind)) for kind, b in self.collectives_at(cluster, n)]
        (g, m), dense = levels, 4.0 * workload.values
        across = self.shard(g).collectives_at(replace(cluster, gpus_per_node=1), m)
        return ([("alltoall", dense, g, cluster.intra), ("allgather", dense / g, g, cluster.intra)]
                + [(kind, b, m, replace(cluster.across(kind), bandwidth=cluster.across(kind).bandwidth / g))
                   for kind, b in across])

    def levels(self, cluster: "Cluster", n: int) -> tuple[int, int] | None:
        """(G ranks a node, M nodes) where the exchange runs hierarchical at N workers, else None (flat)."""
        g, m = min(cluster.gpus_per_node, n), cluster.nodes(n)
        return (g, m) if self.hierarchical and g > 1 and m > 1 else None

    def shard(self, g: int) -> "Method":    # one G-th of the gradient: the hierarchical form's part across nodes
        return replace(self, collectives=tuple((k, b / g) for k, b in self.collectives), compress_s=self.compress_s / g,
                       decode_s=self.decode_s / g, hierarchical=False)

    def bytes_per_step(self, workload: Workload, cluster: "Cluster | None" = None, n: int = 2) -> float:
        """What one worker hands to collectives per step (bytes_sent_per_step's meaning)."""
        if self.kind == "exchange":
            if cluster is None:
                return float(sum(b for _, b in self.collectives))
            return float(sum(b for _, b, _, _ in self.calls(workload, cluster, n)))
        if self.kind == "local_sgd":
            return 4.0 * (workload.state_values or 2 * workload.values) / self.local_steps
        return self.value_bytes * workload.values

    def wire_bytes_per_step(self, workload: Workload, cluster: "Cluster", n: int) -> float:
        """What one worker sends over the links per step (wire_bytes_per_step's meaning: toolkit/exchange/wire.py)."""
        if self.kind == "exchange":
            return float(sum(wire.sent(kind, b, among) for kind, b, among, _ in self.calls(workload, cluster, n)))
        return wire.sent("allreduce", self.bytes_per_step(workload), n)


@dataclass(frozen=True)
class StepCost:
    n: int
    step_s: float
    compute_s: float
    comm_s: float            # communication time in all (hidden or not)
    exposed_s: float         # what adds to the step: communication not hidden, compression, straggling
    bytes_per_step: float
    wire_bytes_per_step: float = 0.0

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s


def step_time(workload: Workload, method: Method, cluster: Cluster, n: int) -> StepCost:
    compute = workload.compute_s
    wait = compute * workload.straggle * expected_max_normal(n)
    if n <= 1:       # Horovod reduces nothing in a 1-worker job; the toolkit's exchange still compresses
        extra = method.compress_s + method.decode_s if method.kind == "exchange" else 0.0
        return StepCost(1, compute + extra, compute, 0.0, extra, 0.0, 0.0)
    if method.kind in ("horovod", "ddp"):         # overlapped with the backward pass
        backward = compute * workload.backward_fraction
        if method.kind == "horovod":
            reduce_cost = {"allreduce": cluster.allreduce, "hierarchical": cluster.hierarchical_allreduce,
                           "adasum": cluster.adasum}[method.reduce]
            sizes = [method.value_bytes * v for v in workload.tensor_values]
            comm = sum(reduce_cost(s, n) for s in _fused(sizes, method.fusion_bytes))
            end = horovod_comm_end(sizes, backward, lambda b: reduce_cost(b, n), method.fusion_bytes,
                                   method.cycle_s, workload.ready)
        else:
            link = replace(cluster.ring_link(n, "allreduce"), overhead=0.0)    # no negotiation: DDP launches its ring directly
            grads = [4.0 * v for v in workload.tensor_values]     # float32 gradients fill the buckets
            ready = ready_times(grads, backward, workload.ready)
            buckets = ddp_buckets(grads, method.bucket_limits)
            sizes = [method.value_bytes / 4.0 * sum(grads[i] for i in b) for b in buckets]
            comm = sum(ring_allreduce(s, n, link) for s in sizes)
            end = ddp_comm_end(sizes, [ready[b[-1]] for b in buckets], lambda b: ring_allreduce(b, n, link))
        exposed = max(0.0, end - backward) + wait
    elif method.kind == "exchange":
        calls = method.calls(workload, cluster, n)
        comm = sum(COLLECTIVES[kind](b, among, link) for kind, b, among, link in calls)
        levels = method.levels(cluster, n)      # hierarchical: the compression work is on a G-th, among M
        work, among, first = (method, n, calls[0][0]) if levels is None else (method.shard(levels[0]), levels[1],
                                                                               calls[2][0])
        exposed = comm + exchange_work(first == "alltoall", among, work.compress_s, work.decode_s) + wait
    elif method.kind == "local_sgd":
        state = 4.0 * (workload.state_values or 2 * workload.values)
        comm = cluster.allreduce(state, n) / method.local_steps
        exposed = comm + wait / math.sqrt(method.local_steps)     # k steps' variation, one wait
    else:
        raise ValueError(method.kind)
    return StepCost(n, compute + exposed, compute, comm, exposed, method.bytes_per_step(workload, cluster, n),
                    method.wire_bytes_per_step(workload, cluster, n))


def _fused(sizes: list[float], fusion: float) -> list[float]:
    """All gradients in fusion buffers (when all are ready at once): the total communication time."""
    out, buffer = [], 0.0
    for s in sizes:
        if buffer and buffer + s > fusion:
            out.append(buffer)
            buffer = 0.0
        buffer += s
    return out + ([buffer] if buffer else [])


# -- where a method pays ---------------------------------------------------------------------------

def with_bandwidth(cluster: Cluster, n: int, bandwidth: float) -> Cluster:
    """The cluster with the link N workers' ring crosses set to `bandwidth` (bytes/s)."""
    return cluster.with_bandwidth(n, bandwidth)


def crossing(workload: Workload, method: Method, base: Method, cluster: Cluster, n: int,
             low: float = 1.25e5, high: float = 1e13) -> float | None:
    """The link bandwidth (bytes/s) below which `method`'s step is shorter than `base`'s at N workers,
    the link N workers' ring crosses varied alone (latency and overheads kept): `high` when it is faster
    on any link up to `high`, None when it is not faster even at `low` (1 Mbit/s-ish). Bisection on a log
    scale; the model's steps are monotone in the bandwidth."""
    def faster(bandwidth: float) -> bool:
        c = with_bandwidth(cluster, n, bandwidth)
        return step_time(workload, method, c, n).step_s < step_time(workload, base, c, n).step_s

    if not faster(low):
        return None
    if faster(high):
        return high
    lo, hi = math.log(low), math.log(high)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if faster(math.exp(mid)) else (lo, mid)
    return math.exp(lo)


# -- a plan ----------------------------------------------------------------------------------------

@dataclass
class Plan:
    workload: Workload
    cluster: Cluster
    methods: list
    gpus: list
    rows: dict = field(default_factory=dict)       # method name -> [StepCost per gpus]

    def run(self) -> "Plan":
        self.rows = {m.name: [step_time(self.workload, m, self.cluster, n) for n in self.gpus] for m in self.methods}
        return self

    def crossings(self, base_name: str | None = None) -> dict:
        """{method name: [link bandwidth below which it beats `base_name` (the first method: none), per N]}
        (bytes/s; None: not even at 1 Mbit/s)."""
        base = next(m for m in self.methods if m.name == base_name) if base_name else self.methods[0]
        return {m.name: [crossing(self.workload, m, base, self.cluster, n) for n in self.gpus]
                for m in self.methods if m is not base}

    def recommend(self, tolerance: float = 0.05) -> tuple[Method, str]:
        """The fastest method at the largest N, unless a lossless one is within `tolerance` of it (the
        lossless one then: it changes nothing about convergence); with the reason in words. When the
        plan has both engines' allreduce paths (Horovod's and DDP's), the reason says which engine
        wins, each engine's method chosen by the same rule."""
        n = self.gpus[-1]
        speed = {m.name: 1.0 / self.rows[m.name][-1].step_s for m in self.methods}

        def choose(methods: list) -> tuple[Method, Method]:      # (the pick, the fastest)
            best = max(methods, key=lambda m: speed[m.name])
            lossless = [m for m in methods if m.lossless]
            if not best.lossless and lossless:
                safe = max(lossless, key=lambda m: speed[m.name])
                if speed[safe.name] >= (1 - tolerance) * speed[best.name]:
                    return safe, best
            return best, best

        pick, best = choose(self.methods)
        cost = self.rows[pick.name][-1]
        plain = self.rows[self.methods[0].name][-1]
        why = (f"at {n} GPUs {pick.name} predicts {100 * cost.efficiency:.0f}% scaling efficiency "
               f"({1000 * cost.step_s:.1f} ms a step, {1000 * cost.exposed_s:.1f} ms of it not hidden behind compute)")
        if pick is not self.methods[0]:
            why += f", against {100 * plain.efficiency:.0f}% for {self.methods[0].name}"
        if pick is not best:
            why += (f"; {best.name} is faster by {100 * (speed[best.name] / speed[pick.name] - 1):.1f}% but does not "
                    f"sum the gradients exactly (lossy, or another combination), within the {100 * tolerance:.0f}% tolerance")
        elif not pick.lossless:
            why += "; it is lossy: check its accuracy on your model (docs/COMMUNICATION.md)"
        if cost.efficiency > 0.97:
            why += "; communication is not the bottleneck here"
        engines = [choose(same)[0] for same in ([m for m in self.methods if m.kind == k] for k in ("horovod", "ddp"))
                   if same]
        if len(engines) == 2:       # which engine, each with the method the same rule picks among its own
            win, lose = sorted(engines, key=lambda m: -speed[m.name])
            said = [f"{ENGINES[m.engine]} with {m.name} ({100 * self.rows[m.name][-1].efficiency:.0f}%)"
                    for m in (win, lose)]
            why += (f"; engine: either, {said[0]} and {said[1]} within 1%" if speed[win.name] < 1.01 * speed[lose.name]
                    else f"; engine: {said[0]} over {said[1]}")
        return pick, why


ENGINES = {"native": "native (torch DDP)", "horovod": "horovod"}      # the backend's name, as --backend takes it


def with_fusion(method: Method, fusion_bytes: float | None, cycle_s: float | None) -> Method:
    changes: dict[str, Any] = {}
    if fusion_bytes is not None:
        changes["fusion_bytes"] = fusion_bytes
    if cycle_s is not None:
        changes["cycle_s"] = cycle_s
    return replace(method, **changes) if changes else method
