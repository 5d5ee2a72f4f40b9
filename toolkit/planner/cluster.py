"""A cluster as the planner prices it (toolkit/planner/scaling.py): nodes of G GPUs, one network link a node
between them and a faster link inside one, each an alpha-beta `Link` (toolkit/exchange/wire.py).

A calibration (benchmarks/scaling_calibrate.py) may give the link between nodes per collective kind
(`kinds`): Gloo's allgather moves a byte at a different speed than its allreduce (and the alltoall at
another), which one link for all of them does not capture. A kind it does not name uses `inter`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from toolkit.exchange.wire import Link, pairwise_alltoall, ring_allgather, ring_allreduce, tree_broadcast


@dataclass(frozen=True)
class Cluster:
    gpus_per_node: int
    inter: Link           # between nodes (one link per node)
    intra: Link           # between the GPUs of one node
    kinds: dict = field(default_factory=dict)      # collective kind -> its link between nodes (a calibration's)

    def nodes(self, n: int) -> int:
        return math.ceil(n / self.gpus_per_node)

    def across(self, kind: str | None = None) -> Link:
        """The link between nodes for a collective of `kind`."""
        return self.kinds.get(kind, self.inter)

    def ring_link(self, n: int, kind: str | None = None) -> Link:
        return self.across(kind) if self.nodes(n) > 1 else self.intra

    def allreduce(self, size: float, n: int) -> float:
        return ring_allreduce(size, n, self.ring_link(n, "allreduce"))

    def allgather(self, size_per_rank: float, n: int) -> float:
        return ring_allgather(size_per_rank, n, self.ring_link(n, "allgather"))

    def broadcast(self, size: float, n: int) -> float:
        return tree_broadcast(size, n, self.ring_link(n))

    def alltoall(self, size: float, n: int) -> float:
        return pairwise_alltoall(size, n, self.ring_link(n, "alltoall"))

    def hierarchical_allreduce(self, size: float, n: int) -> float:
        g, m = min(self.gpus_per_node, n), self.nodes(n)
        within = 0.0 if g <= 1 else self.intra.cost(g - 1, (g - 1) / g * size)    # reduce-scatter; allgather
        return 2 * within + ring_allreduce(size, m, self.across("allreduce"))

    def adasum(self, size: float, n: int) -> float:
        g, m = min(self.gpus_per_node, n), self.nodes(n)
        within = 0.0 if g <= 1 else self.intra.cost(g - 1, (g - 1) / g * size)
        across = 0.0 if m <= 1 else self.inter.cost(2 * math.ceil(math.log2(m)), 2 * (m - 1) / m * size)
        return 2 * within + across

    def with_bandwidth(self, n: int, bandwidth: float) -> "Cluster":
        """The link N workers' ring crosses set to `bandwidth` (bytes/s); a calibration's per-kind links
        between nodes scaled by the same factor."""
        if self.nodes(n) == 1:
            return replace(self, intra=replace(self.intra, bandwidth=bandwidth))
        factor = bandwidth / self.inter.bandwidth
        return replace(self, inter=replace(self.inter, bandwidth=bandwidth),
                       kinds={k: replace(v, bandwidth=v.bandwidth * factor) for k, v in self.kinds.items()})
