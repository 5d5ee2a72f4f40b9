"""Sharded streaming datasets (`dataset: shards:PATH`, `toolkit.shards(PATH)`): the shard index
(index.json beside the shards: their format, kind and samples each) and what a loader reads of it
(`ShardSource`) — framework-free. Which samples each rank reads: toolkit/data/stream_sampler.py. The
frameworks read the shards with their own readers (adapters/<framework>/shards.py: webdataset tar
files for torch, TFRecord for TensorFlow, RecordIO for MXNet); `toolkit shards` writes them
(toolkit/data/shardwrite.py).
"""
from __future__ import annotations

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


def fail(spec: str, why: str):
    """The one line for a bad `shards:` value, naming it."""
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
            fail(spec, f"no folder or shard files match {path}; give the folder `toolkit shards` wrote or a "
                       "pattern of its shard files (e.g. shards/train-{000000..000009}.tar)")
        folders = {Path(f).resolve().parent for f in files}
        if len(folders) > 1:
            fail(spec, f"the pattern names shards in {len(folders)} folders; give shards of one folder (its "
                       f"{INDEX} counts them)")
        root, chosen = folders.pop(), {Path(f).resolve().name for f in files}
    index_file = root / INDEX
    if not index_file.is_file():
        fail(spec, f"{root} has no {INDEX}; write the shards with `toolkit shards SOURCE {root} --framework F` "
                   "(it writes the index beside them)")
    try:
        meta = json.loads(index_file.read_text())
        fmt, kind = meta["format"], meta["kind"]
        splits = {name: tuple(Shard(str((root / s["file"]).resolve()), int(s["samples"]))
                              for s in meta["splits"][name]) for name in ("train", "eval")}
    except (ValueError, KeyError, TypeError) as e:
        fail(spec, f"{index_file} is not a shard index ({e.__class__.__name__}: {e}); write it again with "
                   "`toolkit shards`")
    if fmt not in SUFFIX or kind not in KINDS:
        fail(spec, f"{index_file}: format {fmt!r} / kind {kind!r} unknown; write it again with `toolkit shards`")
    train = splits["train"]
    if chosen is not None:
        known = {Path(s.path).name for s in train}
        if stray := sorted(chosen - known):
            fail(spec, f"{stray[0]} is not a training shard of {index_file}; name training shards only "
                       "(the evaluation split keeps its own)")
        train = tuple(s for s in train if Path(s.path).name in chosen)
    missing = [s.path for s in train + splits["eval"] if not os.path.exists(s.path)]
    if missing:
        fail(spec, f"{missing[0]} is in {index_file} but missing; copy the whole folder `toolkit shards` wrote")
    if not train or not sum(s.samples for s in train):
        fail(spec, f"{root} holds no training samples; write shards from a dataset with some")
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
