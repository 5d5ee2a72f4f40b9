"""Sharded streaming datasets (`dataset: shards:PATH`): the shard index, and which samples each rank
reads, in which order, from where — framework-free. The frameworks read the shards with their own
readers (adapters/<framework>/shards.py: webdataset tar files for torch, TFRecord for TensorFlow,
RecordIO for MXNet); `toolkit shards` writes them (toolkit/commands/shards.py).

The guarantee, as the in-memory loaders keep it (toolkit/run/data.py), on streams:
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
import glob
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ToolkitError

INDEX = "index.json"
VERSION = 1
# Each framework's shard format (what its own reader reads) and the files' suffix.
FORMATS = {"torch": "webdataset", "tensorflow": "tfrecord", "mxnet": "recordio"}
SUFFIX = {"webdataset": ".tar", "tfrecord": ".tfrecord", "recordio": ".rec"}
WINDOW = 2048           # samples each rank shuffles together (its shuffle buffer)
KINDS = ("image", "tokens")


@dataclass(frozen=True)
class Shard:
    path: str           # the shard file (absolute)
    samples: int


@dataclass(frozen=True)
class ShardIndex:
    """A folder of shards, as its index.json describes it (nothing scans the shards to count them)."""
    spec: str
    root: Path
    format: str                 # webdataset | tfrecord | recordio
    kind: str                   # image (encoded PNG/JPEG bytes + class) | tokens (context + 1 byte tokens)
    num_classes: int
    train: tuple[Shard, ...]
    eval: tuple[Shard, ...]
    mean: tuple = (0.0, 0.0, 0.0)
    std: tuple = (1.0, 1.0, 1.0)
    context: int | None = None
    image_size: int | None = None   # the images' side when they all have one (cifar10), else None

    def split(self, train: bool) -> tuple[Shard, ...]:
        return self.train if train else self.eval


@dataclass(frozen=True)
class ShardSource:
    """What `session.loader` reads as a sharded stream: one split of a shard index. `ids=True`: each
    sample is (x, y, id), id its position in the source `toolkit shards` read (tests count them)."""
    index: ShardIndex
    train: bool = True
    ids: bool = False

    @property
    def shards(self) -> tuple[Shard, ...]:
        return self.index.split(self.train)

    def __len__(self) -> int:
        return sum(s.samples for s in self.shards)


def shards(path: str, split: str = "train", ids: bool = False) -> ShardSource:
    """A user loop's handle on shards written by `toolkit shards`: `session.loader(toolkit.shards(PATH))`."""
    if split not in ("train", "eval"):
        raise ToolkitError(f"toolkit.shards(split={split!r}): give 'train' or 'eval'")
    return ShardSource(read_index(f"shards:{path}", path), split == "train", ids)


def _fail(spec: str, why: str):
    raise ToolkitError(f"dataset={spec!r}: {why}")


def expand_braces(pattern: str) -> list[str]:
    """`a-{000..003}.tar` and `{x,y}` expanded (webdataset's shard notation), left to right."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    body, head, tail = m.group(1), pattern[: m.start()], pattern[m.end():]
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        a, b = rng.groups()
        width = len(a) if a.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(a), int(b) + 1)]
    else:
        items = body.split(",")
    return [out for item in items for out in expand_braces(head + item + tail)]


def read_index(spec: str, path: str) -> ShardIndex:
    """The index of a folder written by `toolkit shards`, or of the folder holding the shard files a
    glob / brace pattern names (those are the training shards; the evaluation split keeps its own)."""
    root, chosen = Path(path), None
    if not root.is_dir():
        files = sorted({f for p in expand_braces(path) for f in glob.glob(p)})
        if not files:
            _fail(spec, f"no folder or shard files match {path}; give the folder `toolkit shards` wrote or a "
                        "pattern of its shard files (e.g. shards/train-{000000..000009}.tar)")
        folders = {Path(f).resolve().parent for f in files}
        if len(folders) > 1:
            _fail(spec, f"the pattern names shards in {len(folders)} folders; give shards of one folder (its "
                        f"{INDEX} counts them)")
        root, chosen = folders.pop(), {Path(f).resolve().name for f in files}
    index_file = root / INDEX
    if not index_file.is_file():
        _fail(spec, f"{root} has no {INDEX}; write the shards with `toolkit shards SOURCE {root} --framework F` "
                    "(it writes the index beside them)")
    try:
        meta = json.loads(index_file.read_text())
        fmt, kind = meta["format"], meta["kind"]
        splits = {name: tuple(Shard(str((root / s["file"]).resolve()), int(s["samples"]))
                              for s in meta["splits"][name]) for name in ("train", "eval")}
    except (ValueError, KeyError, TypeError) as e:
        _fail(spec, f"{index_file} is not a shard index ({e.__class__.__name__}: {e}); write it again with "
                    "`toolkit shards`")
    if fmt not in SUFFIX or kind not in KINDS:
        _fail(spec, f"{index_file}: format {fmt!r} / kind {kind!r} unknown; write it again with `toolkit shards`")
    train = splits["train"]
    if chosen is not None:
        known = {Path(s.path).name for s in train}
        if stray := sorted(chosen - known):
            _fail(spec, f"{stray[0]} is not a training shard of {index_file}; name training shards only "
                        "(the evaluation split keeps its own)")
        train = tuple(s for s in train if Path(s.path).name in chosen)
    missing = [s.path for s in train + splits["eval"] if not os.path.exists(s.path)]
    if missing:
        _fail(spec, f"{missing[0]} is in {index_file} but missing; copy the whole folder `toolkit shards` wrote")
    if not train or not sum(s.samples for s in train):
        _fail(spec, f"{root} holds no training samples; write shards from a dataset with some")
    return ShardIndex(spec, root, fmt, kind, int(meta.get("num_classes") or 0), train, splits["eval"],
                      tuple(meta.get("mean", (0.0, 0.0, 0.0))), tuple(meta.get("std", (1.0, 1.0, 1.0))),
                      meta.get("context"), meta.get("image_size"))


def write_index(root: Path, *, format: str, kind: str, source: str, framework: str, splits: dict,
                num_classes: int = 0, **extra) -> Path:
    """index.json: what the shards hold and how many samples each has ({split: [(file, samples)]})."""
    meta = {"toolkit_shards": VERSION, "format": format, "kind": kind, "framework": framework, "source": source,
            "num_classes": num_classes, **extra,
            "splits": {name: [{"file": f, "samples": n} for f, n in files] for name, files in splits.items()}}
    out = Path(root) / INDEX
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, out)
    return out


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
    docstring says how). The same interface as toolkit.run.data.Sampler: the trainer and the
    session's checkpoints use both alike."""

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
        pieces = []
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


def datasets(config, path: str, session=None):
    """`dataset: shards:PATH` for the built-in trainer: the index read, checked against the model and
    the framework; (train, eval) as ShardSources."""
    from toolkit.config import IMAGE_MODELS, Model, is_reference, unset_default
    from toolkit.run.data import Datasets, image_shape
    spec = config.dataset
    index = read_index(spec, path)
    want = FORMATS[config.framework]
    if index.format != want:
        owner = {v: k for k, v in FORMATS.items()}[index.format]
        _fail(spec, f"these are {index.format} shards ({owner}'s); {config.framework} reads {want}: write them with "
                    f"`toolkit shards SOURCE OUT --framework {config.framework}`")
    if not is_reference(config.model):
        if index.kind == "tokens" and config.model != Model.TRANSFORMER_LM.value:
            _fail(spec, f"these shards hold token sequences: use model transformer_lm (or your own), not {config.model!r}")
        if index.kind == "image" and config.model not in IMAGE_MODELS:
            _fail(spec, f"these shards hold images: use model resnet18 or resnet50 (or your own), not {config.model!r}")
    if index.kind == "tokens":
        if config.context != index.context:
            _fail(spec, f"these shards hold windows of context {index.context}; set --context {index.context} "
                        "(or write the shards again with another --context)")
        return Datasets(ShardSource(index, True), ShardSource(index, False), index.context, 256, (index.context,))
    if index.image_size and config.image_size and config.image_size != index.image_size:
        _fail(spec, f"these shards hold {index.image_size}x{index.image_size} images; drop image_size")
    size = index.image_size or config.image_size or unset_default("image_size")
    return Datasets(ShardSource(index, True), ShardSource(index, False), 3 * size * size, index.num_classes,
                    image_shape(config, size))
