"""Which samples of a sharded stream (`dataset: shards:PATH`) each rank reads, in which order, from
where, and its position (`StreamSampler`) — framework-free. The shard index it plans over:
toolkit/data/streams.py; the frameworks read the shards with their own readers
(adapters/<framework>/shards.py).

The guarantee, as the in-memory loaders keep it (toolkit/data/sampler.py), on streams:
- One permutation of the shards per epoch (seed, epoch): the epoch's sequence is the shards in that
  order, end to end. It is cut into `world` contiguous spans of equal length, a multiple of
  `batch_size x accumulation_steps`: shards are dealt to ranks balanced by sample count (a shard
  at a cut is read in part by two ranks, each reading only its part); the tail that does not fill a
  step on every rank is dropped, as the last partial step is in memory.
- Each rank reads its span front to back and shuffles it within windows of `window` samples
  (a shuffle buffer whose order is a function of seed, epoch, segment, rank and window alone).
- Progress is a list of segments `[world, samples each rank consumed]`: within a segment every
  rank consumed the same count (steps are synchronous). A resume in the same world skips whole
  windows without reading them and the consumed part of the current one. A new world (an elastic
  resize, or a resume with another number of ranks) closes the segment: what each rank had not yet
  consumed of its span (the rest of its window, then its span's tail) plus the dropped tail becomes
  the next segment's sequence, dealt to the new world the same way. So no sample is repeated or
  skipped within an epoch, whatever happens to the world.

Evaluation: the eval shards in their order, every sample once across the ranks, nothing dropped.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from toolkit.errors import ToolkitError

WINDOW = 2048           # samples each rank shuffles together (its shuffle buffer)


# -- the plan: which samples each rank reads ---------------------------------------------------------
def _rng(*key):
    import numpy as np
    return np.random.default_rng([int(k) for k in key])


def _take(intervals, count):
    """(the first `count` positions of `intervals` as intervals, the rest)."""
    head, rest = [], list(intervals)
    while count and rest:
        a, b = rest.pop(0)
        if b - a <= count:
            head.append((a, b))
            count -= b - a
        else:
            head.append((a, a + count))
            rest.insert(0, (a + count, b))
            count = 0
    return head, rest


def _positions(intervals, start=0, stop=None):
    """The positions of `intervals` from offset `start` to `stop`, as one int64 array."""
    import numpy as np
    out, offset = [], 0
    for a, b in intervals:
        n = b - a
        lo, hi = max(start - offset, 0), n if stop is None else min(stop - offset, n)
        if lo < hi:
            out.append(np.arange(a + lo, a + hi, dtype=np.int64))
        offset += n
        if stop is not None and offset >= stop:
            break
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _as_intervals(positions):
    """Sorted positions -> coalesced intervals."""
    out = []
    for p in positions:
        p = int(p)
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out


def _length(intervals) -> int:
    return sum(b - a for a, b in intervals)


class StreamSampler:
    """Which samples of a shard split this process reads, step by step, and its position (the module's
    docstring says how). The same interface as toolkit.data.sampler.Sampler: the trainer and the
    session's checkpoints use both alike."""
    segments: list          # [world, samples each rank consumed], the last current

    def __init__(self, sizes, batch_size: int, accumulation_steps: int = 1, world: int = 1,
                 replicas: range | None = None, seed: int = 0, train: bool = True, shuffle: bool = True,
                 window: int = WINDOW):
        self.sizes = [int(s) for s in sizes]
        self.n = sum(self.sizes)
        if self.n < 1:
            raise ToolkitError("the shards hold no samples: give the loader at least one")
        self.batch_size, self.k, self.seed, self.train, self.shuffle = batch_size, accumulation_steps, seed, train, shuffle
        self.window = max(1, int(window))
        self.epoch, self.segments = 0, []      # segments: [world, samples each rank consumed], the last current
        self.resize(world, replicas if replicas is not None else range(1))

    def resize(self, world: int, replicas: range) -> None:
        if len(replicas) != 1:
            raise ToolkitError(f"session.loader(shards): {len(replicas)} replicas in one process (a mirrored "
                               "strategy); sharded streams are read one replica per process: run one rank per "
                               "device (backend horovod, or strategy multi_worker_mirrored)")
        self.world, self.replicas = world, replicas

    @property
    def rank(self) -> int:
        return self.replicas.start

    @property
    def per_step(self) -> int:
        return self.batch_size * self.k

    @property
    def step_samples(self) -> int:
        return self.per_step * self.world

    @property
    def position(self) -> int:
        """Samples of the epoch consumed by all ranks together."""
        return sum(w * c for w, c in self.segments)

    # -- the epoch's sequence and its deal ------------------------------------------------------------
    def shard_order(self):
        import numpy as np
        n = len(self.sizes)
        return _rng(self.seed, self.epoch, 17).permutation(n) if self.train and self.shuffle else np.arange(n)

    def _deal(self, intervals, world):
        """(spans, tail): `world` contiguous spans of equal length (a multiple of a step's samples per
        rank; evaluation: lengths differing by at most one, nothing dropped)."""
        total = _length(intervals)
        if not self.train:
            spans, rest = [], intervals
            for r in range(world):
                spans_r, rest = _take(rest, total // world + (r < total % world))
                spans.append(spans_r)
            return spans, []
        share = (total // (world * self.per_step)) * self.per_step
        spans, rest = [], intervals
        for _ in range(world):
            span, rest = _take(rest, share)
            spans.append(span)
        return spans, rest

    def _window_order(self, segment: int, rank: int, w: int, size: int):
        import numpy as np
        if not (self.train and self.shuffle):
            return np.arange(size)
        return _rng(self.seed, self.epoch, segment, rank, w).permutation(size)

    def _leftover(self, span, segment, rank, consumed):
        """What rank `rank` had not consumed of `span` after `consumed` samples, as intervals."""
        w = consumed // self.window
        start, stop = w * self.window, min((w + 1) * self.window, _length(span))
        left = []
        if start < stop:
            positions = _positions(span, start, stop)
            order = self._window_order(segment, rank, w, len(positions))
            left = _as_intervals(sorted(positions[order[consumed - start:]]))
        _, after = _take(span, stop)
        return left + after

    def _open_segment(self) -> None:
        """The last segment is this world's: a new world starts a new one."""
        if not self.segments or self.segments[-1][0] != self.world:
            self.segments = self.segments + [[self.world, 0]]

    def _current(self):
        """(segment number, this segment's intervals, its spans) with past segments replayed."""
        self._open_segment()
        intervals = [(0, self.n)]
        for i, (world, consumed) in enumerate(self.segments[:-1]):
            spans, tail = self._deal(intervals, world)
            intervals = [piece for r, span in enumerate(spans)
                         for piece in self._leftover(span, i, r, consumed)] + tail
        return len(self.segments) - 1, intervals, self._deal(intervals, self.world)[0]

    @property
    def steps_per_epoch(self) -> int:
        """Training: optimizer steps in a whole epoch in this world; evaluation: this rank's batches."""
        if self.train:
            return self.n // self.step_samples
        share = self.n // self.world + (self.rank < self.n % self.world)
        return -(-share // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.segments = epoch, []

    def samples_left(self) -> int:
        """Samples this rank still reads in the epoch."""
        _, _, spans = self._current()
        return _length(spans[self.rank]) - self.segments[-1][1]

    def steps_left(self) -> int:
        """Optimizer steps (training) or batches (evaluation) this rank still has in the epoch."""
        left = self.samples_left()
        return left // self.per_step if self.train else -(-left // self.batch_size)

    def batch_sizes(self) -> list[int]:
        """The samples of each remaining micro-batch: training `batch_size` each, `accumulation_steps`
        a step; evaluation `batch_size` each and the rest last."""
        left, b = self.samples_left(), self.batch_size
        if self.train:
            return [b] * (left // self.per_step * self.k)
        return [b] * (left // b) + ([left % b] if left % b else [])

    def reads(self) -> "RankReads":
        """This rank's remaining stream: the shard pieces to read front to back, the window orders,
        how many samples of the first window were consumed already."""
        segment, _, spans = self._current()
        span, consumed = spans[self.rank], self.segments[-1][1]
        first = consumed // self.window
        order, starts = self.shard_order(), []
        total = 0
        for j in order:
            starts.append(total)
            total += self.sizes[j]
        pieces: list = []
        for a, b in _take(span, first * self.window)[1]:
            while a < b:
                i = bisect.bisect_right(starts, a) - 1
                shard, lo = int(order[i]), a - starts[i]
                hi = min(b - starts[i], self.sizes[shard])
                if pieces and pieces[-1][0] == shard and pieces[-1][1][-1][1] == lo:
                    pieces[-1][1][-1] = (pieces[-1][1][-1][0], hi)
                elif pieces and pieces[-1][0] == shard and pieces[-1][1][-1][1] < lo:
                    pieces[-1][1].append((lo, hi))
                else:
                    pieces.append((shard, [(lo, hi)]))
                a += hi - lo
        length = _length(span)
        windows = [self._window_order(segment, self.rank, w, min(self.window, length - w * self.window))
                   for w in range(first, -(-length // self.window))]
        return RankReads(pieces, windows, consumed - first * self.window)

    def advance(self, samples: int | None = None) -> None:
        """One optimizer step (training) or one batch of `samples` (evaluation) consumed by every rank (no
        replay of the past segments: a step's work stays a counter)."""
        self._open_segment()
        self.segments[-1][1] += self.per_step if samples is None else samples

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position,
                "segments": [list(s) for s in self.segments if s[1]]}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        if "segments" in state:
            self.segments = [[int(w), int(c)] for w, c in state["segments"]]
        elif int(state.get("position", 0)) == 0:
            self.segments = []
        elif int(state["position"]) != self.position:
            raise ToolkitError("a sharded stream's position needs its segments (a checkpoint of an in-memory "
                               "loader cannot resume a stream); resume from a checkpoint of this dataset")


@dataclass
class RankReads:
    """One rank's remaining stream: `pieces` [(shard number, [(start, stop), ...])] in reading order,
    `windows` the order of each window's samples (indices into the window as read), `skip` samples of
    the first window already consumed."""
    pieces: list
    windows: list
    skip: int

    def records(self, read_shard, shards):
        """The records in the stream's order: `read_shard(shard, ranges)` yields the raw records of one
        shard file's sample ranges in order (the framework's reader); windows are reordered in memory."""
        def raw():
            for shard, ranges in self.pieces:
                yield from read_shard(shards[shard], ranges)
        source = raw()
        skip = self.skip
        for order in self.windows:
            window = [next(source) for _ in range(len(order))]
            for i in order[skip:]:
                yield window[i]
            skip = 0
