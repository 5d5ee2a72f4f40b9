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
  for the allgathered methods; twice a payload's worth for the compressed allreduce). torch's bf16 and
  int8 (flat or hierarchical) overlap the backward pass instead (`Method.bucket_bytes`): the flat
  gradient in buckets of `bucket_mb` (toolkit/exchange/buckets.py), each exchanged with its
  compression work once its last gradient is ready and the bucket before it has started, one after
  another (`exchange_comm_end`); only what runs past the backward pass adds to the step.
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
from toolkit.planner.timeline import (
    DDP_BUCKET_LIMITS,
    ddp_buckets,
    ddp_comm_end,
    exchange_buckets,
    horovod_comm_end,
    ready_times,
)

COLLECTIVES = {"allreduce": ring_allreduce, "allgather": ring_allgather, "alltoall": pairwise_alltoall}
HOROVOD_FUSION_BYTES = 128 * 1024 * 1024   # Horovod 0.28.1's default (horovod/common/operations.cc)


# -- one step ----------------------------------------------------------------------------------------

def expected_max_normal(n: int) -> float:
    """E[max of n standard normals], Blom's approximation (within ~1% for n >= 2); 0 for n = 1."""
    if n <= 1:
        return 0.0
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def exchange_comm_end(workload: "Workload", method: "Method", cluster: Cluster, n: int, backward_s: float) -> float:
    """When the overlapped exchange's last bucket is done, in seconds from the backward pass's start: each bucket's
    exchange (its share of the collectives and of the compression work) starts once its last gradient is ready
    and the one before it has started, and they run one after another (`ddp_comm_end`'s order)."""
    grads = [4.0 * v for v in workload.tensor_values]
    ready = ready_times(grads, backward_s, workload.ready)
    buckets = exchange_buckets(grads, method.bucket_bytes)
    total = sum(grads)

    def cost(size: float) -> float:
        share = size / total
        comm, work = method.part(share).exchange_s(replace(workload, tensor_values=(workload.values * share,)),
                                                   cluster, n)
        return comm + work
    return ddp_comm_end([b for b, _ in buckets], [ready[i] for _, i in buckets], cost)


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
    bucket_bytes: float = 0.0         # the exchange in buckets of this many float32 bytes beside the backward pass
                                      # (torch's overlap); 0: after it, whole
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
        return replace(self.part(1 / g), hierarchical=False)

    def part(self, share: float) -> "Method":
        """The exchange of a `share` of the gradient (a bucket's): its bytes and compression work in proportion."""
        return replace(self, collectives=tuple((k, b * share) for k, b in self.collectives),
                       compress_s=self.compress_s * share, decode_s=self.decode_s * share)

    def exchange_s(self, workload: Workload, cluster: "Cluster", n: int) -> tuple[float, float]:
        """(communication, compression work) of one exchange of `workload`'s gradient at N workers."""
        calls = self.calls(workload, cluster, n)
        comm = sum(COLLECTIVES[kind](b, among, link) for kind, b, among, link in calls)
        levels = self.levels(cluster, n)      # hierarchical: the compression work is on a G-th, among M
        work, among, first = (self, n, calls[0][0]) if levels is None else (self.shard(levels[0]), levels[1],
                                                                             calls[2][0])
        return comm, exchange_work(first == "alltoall", among, work.compress_s, work.decode_s)

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
        comm, work = method.exchange_s(workload, cluster, n)
        if method.bucket_bytes:
            backward = compute * workload.backward_fraction
            end = exchange_comm_end(workload, method, cluster, n, backward)
            exposed = max(0.0, end - backward) + wait
        else:
            exposed = comm + work + wait
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
