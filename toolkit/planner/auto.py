"""`compression: auto`: the job's links probed, each candidate method's exchange timed, the cheapest kept.

At the first `session.setup()` (the model's gradient size is known, nothing is wrapped yet), every rank:

1. **Probes the links** (`probe`): float32 allreduces of 64 KiB and 4 MiB (the fastest of several runs each, as
   many as take half a second) among the ranks of its host and among the ranks of its local rank across hosts
   (one host, or one rank a host: among every rank); a link (latency, bandwidth) is fitted to each level
   (toolkit/planner/calibration.py's terms). They are reported, and explain the choice; they do not make it.
2. **Times each candidate's exchange** (`measure`) on a gradient of the model's size (at most `CAP` values; a
   larger gradient's times are scaled by its size), through the code that then runs: the backend's own allreduce
   for none, fp16 (a float16 allreduce and a cast each way; DDP's fp16 and bf16 hooks on native), and the toolkit's
   exchange (toolkit/exchange/) for bf16 and int8, flat and, on hosts of several ranks, hierarchical (float32
   hierarchical too), compression included, on the session's device. Rounds in turn, so a slow spell of the machine
   hits each alike; each rank keeps its median round, and the slowest rank's figure counts, so every rank decides
   alike. The median, not the fastest round: a step pays the exchange's usual time, and where a candidate's own
   collectives contend its times spread (measured on 2 x 2 namespace hosts sharing 2 cores at 1 Gbit/s: bf16 1052,
   209 and 983 ms in three rounds, int8 162, 249 and 341 ms; their fastest rounds tied them, their medians do not).
   On one host only the backend's own methods are candidates: inside a host the links are the fast ones, and the
   toolkit's compression pays only across slow links (docs/COMMUNICATION.md measures it). Horovod's fp16 and
   Horovod's hierarchical forms are candidates on GPUs only (`candidates` says why). Where no hierarchical form
   is a candidate, the groups the link probe made are given back before the candidates are timed: Horovod
   negotiates every process set each cycle, and the flat methods ran 1.3-1.6x slower beside them.
3. **Picks** the cheapest, unless an exact method (none, float32 hierarchical) is within 5% or half a
   millisecond of it.

Timing what runs, not pricing it with the planner's model (toolkit/planner/scaling.py): on 2 cores with 4 ranks
the model priced the hierarchical exchange below none where it measured 2.4x none's step (its collectives
through process sets and its compression share the cores), and a float16 allreduce at half a float32 one's cost
where Gloo's float16 sums on a CPU take several times longer.

Nothing hides the exchange while it is timed: it is what a step's exchange costs where the backward pass does
not cover it (Horovod's own allreduce overlaps the backward pass in training, so none and fp16 do a little
better than timed here). Rank 0's log line says what was chosen, the links and each candidate's milliseconds;
the JSON summary has it as `compression_auto`. Chosen once a job: a resumed job chooses again.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from toolkit.config import Compression, Config, ConfigError
from toolkit.errors import ToolkitError
from toolkit.exchange import arrays, hierarchy
from toolkit.exchange.exchanges import GradientExchange, make_exchange
from toolkit.exchange.wire import Link
from toolkit.planner import calibration

SIZES = (64 * 1024, 4 * 1024 * 1024)    # bytes of the link probe's allreduces (float32 values)
CAP = 1 << 24                           # values a candidate's exchange is timed on at most (64 MB of float32):
# scaling by size misranks forms whose time is not proportional to it; measured on 2 x 2 namespace hosts at
# 1 Gbit/s, a 10.5M-value gradient timed on 4M values ranked int8 hierarchical first (its whole step 1.58 s),
# timed whole it ranked int8 flat first (0.58 s), in 40 s of measuring against 22 s
ROUNDS = 3                              # timed rounds (their median counts), after one untimed
MIN_SECONDS, MAX_ROUNDS = 0.5, 40       # more rounds where they take less than this in all (quick exchanges)
DROP = 2.0                              # a candidate over this times the fastest is timed no more
TOLERANCE = 0.05                        # an exact method within this of the fastest is chosen,
RESOLUTION_S = 0.5e-3                   # or within this (below it the timings are jitter: Horovod's cycle)
# (label, compression, hierarchical_exchange: "flat" | "levels"), in the order ties are broken
CANDIDATES = (("none", "none", "flat"), ("fp16", "fp16", "flat"), ("bf16", "bf16", "flat"), ("int8", "int8", "flat"),
              ("fp32 hierarchical", "none", "levels"), ("bf16 hierarchical", "bf16", "levels"),
              ("int8 hierarchical", "int8", "levels"))


@dataclass(frozen=True)
class Probe:
    """The job's shape and the link probe's links (None where there is no such level)."""
    hosts: int
    ranks_per_host: int
    inside: Link | None             # among a host's ranks
    across: Link | None             # among the hosts: the host's link (its K ranks' share, times K)
    seconds: float = 0.0


@dataclass(frozen=True)
class Choice:
    label: str                      # "int8 hierarchical", "none", ...
    config: Config                  # the session's config from now on
    measured: dict                  # label -> one step's exchange in seconds (timed; scaled where capped)
    probe: Probe | None             # None: nothing was timed (one rank, or one candidate)
    why: str
    seconds: float = 0.0            # the probe and the timing, in all

    def line(self) -> str:
        return f"compression auto: {self.label} ({self.why})"

    def summary(self) -> dict:
        out: dict = {"chosen": self.label, "measured_ms": {k: round(1000 * v, 3) for k, v in self.measured.items()},
                     "why": self.why, "seconds": round(self.seconds, 3)}
        if self.probe is not None:
            p = self.probe
            out.update(hosts=p.hosts, ranks_per_host=p.ranks_per_host,
                       inside_bytes_per_s=p.inside.bandwidth if p.inside else None,
                       across_bytes_per_s=p.across.bandwidth if p.across else None)
        return out


def candidates(config: Config, shape: tuple[int, int], groups: bool = True, gpu: bool = False) -> list[tuple[str, Config]]:
    """(label, config) for each method the config allows at this shape (ranks per host K, hosts H): on one host
    the backend's own (none, fp16; DDP's bf16 hook on native); on several, the toolkit's bf16 and int8 too, and
    the hierarchical forms where K > 1, the strategy makes groups of ranks and hierarchical_exchange is not
    false; the flat ones unless hierarchical_exchange is true. Horovod's fp16 only on GPUs (`gpu`): on a CPU
    its float16 sums share the cores with the backward pass it overlaps, which timing it alone does not show
    (measured: 2.4x none's step on 2 ranks of one host, 1.7x on 2 x 2 hosts at 1 Gbit/s). Horovod's hierarchical
    forms only on GPUs too, unless hierarchical_exchange is true: on a CPU each of a step's collectives through
    its process sets waits for the set's ranks, which the backward pass beside it holds up and timing the exchange
    alone does not show (measured on 2 x 2 namespace hosts at 1 Gbit/s: int8 hierarchical timed 0.64-0.96 s and
    ranked first to third, its step took 1.2-1.9 s, 1.4-2.3x none's; Horovod's timeline showed up to 1.06 s
    of negotiation, median 0.18 s, before collectives of 0.04-0.12 s). A candidate the config's rules refuse
    (its backend, sharding, overlap, ...) is left out."""
    k, h = shape
    native = config.backend.value == "native"
    split = k > 1 and h > 1 and groups and config.hierarchical_exchange is not False    # the job has two levels
    levels_possible = split and (config.hierarchical_exchange is True     # not Horovod on a CPU (above)
                                 or hierarchy.unset_means_levels(config.backend.value, gpu))
    own = ("none", "fp16", "bf16") if native else ("none", "fp16")
    out = []
    for label, name, form in CANDIDATES:
        if form == "levels" and not levels_possible:
            continue
        if label == "fp16" and not native and not gpu:      # Horovod's fp16 on a CPU (above)
            continue
        if h == 1 and label not in own:     # one host: its links are the fast ones (the module's docstring)
            continue
        if form == "flat" and config.hierarchical_exchange is True:
            continue
        values = config.to_dict()
        values["compression"] = name
        values["hierarchical_exchange"] = (True if form == "levels" else False if split
                                           else config.hierarchical_exchange)
        try:
            out.append((label, Config.from_dict(values)))
        except ConfigError:
            continue
    return out


def shape_of(session) -> tuple[int, int]:
    """(ranks per host, hosts), or (world, 1) where the ranks do not form equal hosts numbered host by host."""
    if session.world_size <= 1:
        return 1, 1
    places = session.allgather_object((session.local_rank, session.local_size), name="toolkit.auto.places")
    shape = hierarchy.place(places)
    return (session.world_size, 1) if isinstance(shape, str) else shape


def _levels(session, shape: tuple[int, int]):
    """[(level name, the session's collectives among its ranks, their number)]: inside a host and across hosts
    where the job has both and the strategy makes groups (`hierarchy.levels`: made once, the exchange reuses
    them); else one level of every rank."""
    k, h = shape
    if k > 1 and h > 1 and session.strategy.groups:
        lv = hierarchy.levels(session, shape)
        return lv, [("inside", hierarchy.Group(session, lv.local, lv.local_rank), k),
                    ("across", hierarchy.Group(session, lv.cross, lv.host), h)]
    return None, [("across" if h > 1 else "inside", hierarchy.Group(session, None, session.rank), session.world_size)]


def _slowest(session, times: list) -> list:
    """Each figure's largest over the ranks (every rank gets the same list)."""
    return [max(column) for column in zip(*session.allgather_object(times, name="toolkit.auto.times"))]


def _fastest(session, run) -> float:
    """Collective: the fastest of the timed runs of `run` after one untimed: ROUNDS, or as many as take MIN_SECONDS
    (at most MAX_ROUNDS), as many on every rank (the untimed run's slowest rank decides). A quick collective's
    single runs are jitter (the cores' other ranks, Horovod's cycle): measured inside a host of the 2 x 2 test, the
    fastest of 3 ranged 98 MB/s to 2.3 GB/s over three jobs."""
    start = time.perf_counter()
    run()
    first = max(session.allgather_object(time.perf_counter() - start, name="toolkit.auto.probe"))
    best = float("inf")
    for _ in range(int(min(MAX_ROUNDS, max(ROUNDS, MIN_SECONDS / max(first, 1e-6))))):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def probe(session, shape: tuple[int, int]) -> Probe:
    """Collective: the links of this job (see the module's docstring)."""
    import numpy as np

    k, h = shape
    t0 = time.perf_counter()
    _, levels = _levels(session, shape)
    timed, times = [], []
    for level, group, n in levels:
        for size in SIZES:
            data = np.ones(size // 4, np.float32)
            timed.append((level, size, n))
            times.append(_fastest(session, lambda: group.allreduce(data, average=False)))
    samples: dict[str, list] = {}
    for (level, size, n), seconds in zip(timed, _slowest(session, times)):
        samples.setdefault(level, []).append(calibration.Sample("allreduce", n, size, seconds))
    links = {level: _fit(mine) for level, mine in samples.items()}
    if len(levels) == 2:        # the K groups across hosts ran at once, sharing each host's link
        links["across"] = Link(links["across"].alpha, k * links["across"].bandwidth)
    return Probe(h, k, links.get("inside"), links.get("across"), time.perf_counter() - t0)


def _fit(samples: list) -> Link:
    """A level's link from its two allreduces: latency (the intercept at no bytes, at least 0, at most the small
    message's time: below a millisecond or two it is jitter, e.g. Horovod's cycle) as alpha over the ring's
    messages, and the bandwidth of the larger message's time beyond it (at least a 50th of that time: a link
    faster than the probe resolves is taken at that bound)."""
    small, large = sorted(samples, key=lambda s: s.nbytes)[0], sorted(samples, key=lambda s: s.nbytes)[-1]
    (messages, b0), (_, b1) = small.terms(), large.terms()
    slope = (large.seconds - small.seconds) / (b1 - b0)
    latency = min(small.seconds, max(0.0, small.seconds - slope * b0)) if slope > 0 else small.seconds
    return Link(alpha=latency / max(messages, 1), bandwidth=b1 / max(large.seconds - latency, large.seconds / 50))


def _runner(label: str, cfg: Config, session, ops, flat, levels):
    """A function that runs candidate `label`'s exchange of `flat` once, as training would, and waits for it;
    None where the backend cannot run it (every rank alike)."""
    name, world = cfg.compression.value, session.world_size
    if not cfg.toolkit_exchange or (session.strategy.name == "native" and name in ("fp16", "bf16")
                                    and not cfg.hierarchical_exchange):
        dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(name)     # Horovod's fp16, DDP's hooks: cast each way

        def own():
            x = flat if dtype is None else ops.astype(flat, dtype)
            out = session.allreduce(x)
            ops.synchronize()
            return out if dtype is None else ops.astype(ops.asarray(out), "float32")
        return own
    exchange: hierarchy.HierarchicalExchange | GradientExchange
    if cfg.hierarchical_exchange:
        exchange = hierarchy.HierarchicalExchange(hierarchy.summing(cfg, ops), levels, cfg.op.value != "sum", len(flat))
    else:
        exchange = make_exchange(cfg, ops)

    def toolkit():
        buffer = exchange.buffer(len(flat))
        buffer[:] = flat
        exchange.exchange_flat(buffer, session, world)
        ops.synchronize()
    return toolkit


def measure(session, options: list[tuple[str, Config]], values: int, shape: tuple[int, int]) -> dict[str, float]:
    """Collective: label -> seconds of one step's exchange of a `values`-value gradient (timed on at most CAP
    values, scaled by size), the slowest rank's median round. The candidates run in turn each round, the first
    round untimed; after each timed round the ranks agree on the figures so far, and from the second on drop a
    candidate over DROP times the fastest (its figure stays: it cannot win). A candidate the backend cannot run is
    left out."""
    ops = arrays.of(session)
    n = max(1, min(values, CAP))
    flat = ops.random_normal(n, seed=0)
    levels = _levels(session, shape)[0] if any(c.hierarchical_exchange for _, c in options) else None
    runs = {label: _runner(label, cfg, session, ops, flat, levels) for label, cfg in options}
    mine: dict[str, list] = {}          # this rank's timed rounds of each
    agreed: dict[str, float] = {}       # the slowest rank's, after each round
    alive, failed = list(runs), set()
    rounds, r = ROUNDS, 0
    while r <= rounds and alive:
        start_round = time.perf_counter()
        for label in alive:
            start = time.perf_counter()
            try:
                runs[label]()
            except (ToolkitError, RuntimeError, TypeError, ValueError):     # e.g. Gloo without bfloat16 sums
                failed.add(label)       # on every rank alike: the same collective refused everywhere
                continue
            if r:
                mine.setdefault(label, []).append(time.perf_counter() - start)
        alive = [label for label in alive if label not in failed]
        if r == 0:      # quick exchanges are jitter (Horovod's cycle): more rounds, as many on every rank
            first = max(session.allgather_object(time.perf_counter() - start_round, name="toolkit.auto.round"))
            rounds = int(min(MAX_ROUNDS, max(ROUNDS, MIN_SECONDS / max(first, 1e-6))))
        elif alive:
            agreed.update(zip(alive, _slowest(session, [statistics.median(mine[label]) for label in alive])))
            fastest = min(agreed[label] for label in alive)
            if r >= 2:      # two timed rounds each before any is dropped (one can be a slow spell)
                alive = [label for label in alive if agreed[label] <= DROP * fastest]
        r += 1
    return {label: agreed[label] * values / n for label, _ in options if label in agreed}


def pick(measured: dict[str, float], exact: set[str]) -> tuple[str, str]:
    """(label, why): the fastest, unless an exact method is within TOLERANCE or RESOLUTION_S of it (the first such
    in `measured`'s order, CANDIDATES': none before float32 hierarchical)."""
    best = min(measured, key=measured.__getitem__)
    near = [label for label in measured if label in exact
            and (measured[label] <= (1 + TOLERANCE) * measured[best] or measured[label] - measured[best] <= RESOLUTION_S)]
    chosen = near[0] if near else best
    ranked = sorted(measured, key=measured.__getitem__)
    return chosen, "exchange a step: " + ", ".join(f"{label} {1000 * measured[label]:.1f} ms" for label in ranked)


def choose(session, values: int) -> Choice:
    """Collective: the method for this job, for a gradient of `values` values (see the module's docstring)."""
    t0 = time.perf_counter()
    config = session.config
    shape = shape_of(session)
    options = candidates(config, shape, session.strategy.groups, gpu=hierarchy.on_gpu(session.device))
    if not options:
        raise ConfigError("compression: auto found no method this config allows; set compression (none, fp16, "
                          "bf16 or int8)", "compression")
    by_label = dict(options)
    if session.world_size <= 1 or len(options) == 1:
        label = "none" if "none" in by_label else options[0][0]
        why = "one rank: nothing crosses the wire" if session.world_size <= 1 else "the only method this config allows"
        return Choice(label, by_label[label], {}, None, why)
    links = probe(session, shape)
    if not any(c.hierarchical_exchange for _, c in options):
        session.strategy.drop_groups()      # the probe's groups given back: the candidates are timed as they run
    measured = measure(session, options, values, shape)
    label, why = pick(measured, {lb for lb, c in options if c.compression is Compression.NONE})
    said = [f"{where} {_rate(link.bandwidth)}" for where, link in (("inside a host", links.inside),
                                                                    ("across hosts", links.across)) if link]
    seconds = time.perf_counter() - t0
    why = f"{seconds:.1f} s to measure: {', '.join(said)}; {why}"
    return Choice(label, by_label[label], measured, links, why, seconds)


def _rate(bytes_per_s: float) -> str:
    bits = 8 * bytes_per_s
    return f"{bits / 1e9:.2f} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.0f} Mbit/s"
