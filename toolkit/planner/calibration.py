"""The link that explains measured collectives (`benchmarks/scaling_calibrate.py` times them): alpha, bandwidth and the
per-collective overhead of toolkit/exchange/wire.py's cost model, fitted by least squares."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from toolkit.errors import ToolkitError
from toolkit.exchange import wire
from toolkit.exchange.wire import Link


@dataclass(frozen=True)
class Sample:
    """One measured collective: kind ('allreduce' | 'allgather' | 'alltoall'), ranks, bytes (allgather: per rank;
    alltoall: the whole buffer a rank hands over), seconds."""
    kind: str
    n: int
    nbytes: float
    seconds: float

    def terms(self) -> tuple[float, float]:
        """(messages, bytes through one link) of the ring algorithm: the multipliers of alpha and 1/bandwidth."""
        if self.kind in wire.KINDS:
            return wire.messages(self.kind, self.n), wire.sent(self.kind, self.nbytes, self.n)
        raise ValueError(self.kind)


def fit(samples: list[Sample]) -> Link:
    """The link that best explains the samples: alpha, bandwidth and the per-collective overhead, by
    least squares on relative error (times span orders of magnitude, so each sample counts alike).
    When the samples cannot tell the overhead from alpha (one kind of collective at one N: the
    message count never varies), the overhead is left at 0 and alpha carries it."""
    rows = [(s.terms(), s.seconds) for s in samples if s.n > 1 and s.seconds > 0]
    if len(rows) < 2 or len({b for (_, b), _ in rows}) < 2:
        raise ToolkitError("calibration: the samples cannot separate latency from bandwidth "
                           "(time more than one message size, at 2 or more ranks)")
    separable = len({a for (a, _), _ in rows}) > 1
    design = [([1.0, a, b] if separable else [a, b], t) for (a, b), t in rows]
    solution = _least_squares([[x / t for x in xs] for xs, t in design], [1.0] * len(design))
    overhead, alpha, inverse_bw = solution if separable else (0.0, *solution)
    if inverse_bw <= 0:
        raise ToolkitError("calibration: the fitted bandwidth is not positive; time larger messages")
    return Link(alpha=max(alpha, 0.0), bandwidth=1.0 / inverse_bw, overhead=max(overhead, 0.0))


def fit_kinds(samples: list[Sample]) -> dict[str, Link]:
    """One link per collective kind that the samples time at two sizes or more (`fit` on that kind's
    samples): what a kind costs a byte apart from the others (Gloo's allgather against its allreduce)."""
    out = {}
    for kind in sorted({s.kind for s in samples}):
        mine = [s for s in samples if s.kind == kind and s.n > 1 and s.seconds > 0]
        if len({s.nbytes for s in mine}) >= 2:
            out[kind] = fit(mine)
    return out


def _least_squares(x: list[list[float]], y: list[float]) -> list[float]:
    """argmin |x w - y|: the normal equations, by Gaussian elimination with partial pivoting."""
    k = len(x[0])
    a = [[sum(r[i] * r[j] for r in x) for j in range(k)] + [sum(r[i] * v for r, v in zip(x, y))] for i in range(k)]
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) < 1e-12 * max(1.0, max(abs(v) for v in a[p])):
            raise ToolkitError("calibration: the samples cannot separate latency from bandwidth "
                               "(time more than one message size, at 2 or more ranks)")
        a[c], a[p] = a[p], a[c]
        for r in range(k):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [v - f * w for v, w in zip(a[r], a[c])]
    return [a[i][k] / a[i][i] for i in range(k)]


def fit_error(link: Link, samples: list[Sample]) -> float:
    """Median relative error of the fitted link on the samples."""
    errors = [abs(link.cost(*s.terms()) - s.seconds) / s.seconds for s in samples if s.n > 1 and s.seconds > 0]
    return statistics.median(errors) if errors else 0.0
