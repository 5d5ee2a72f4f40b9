"""Sharded streams for torch: WebDataset tar shards, written with webdataset's `TarWriter` and read
with its tar iterators (toolkit/data/stream_sampler.py says which samples each rank reads); images decoded
with PIL and transformed by `imagefolder:`'s transform (adapters/torch/images.py), tokens as `text:`.
DataLoader workers (`loader_workers`) decode micro-batches in turn: worker w takes micro-batches
w, w + workers, ... and the DataLoader yields them in order, so the stream's order is the same with
any number of workers."""
from __future__ import annotations

import io

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from toolkit.adapters.torch import images
from toolkit.errors import ToolkitError


class Writer:
    """One tar shard: a sample is `<id>.<ext>` (the encoded image, or `bin`: the tokens) and `<id>.cls`."""

    def __init__(self, path):
        self._tar = wds.TarWriter(str(path))

    def write(self, sample_id: int, label: int, payload: bytes, ext: str) -> None:
        self._tar.write({"__key__": f"{sample_id:010d}", ext: payload, "cls": str(label).encode()})

    def close(self) -> None:
        self._tar.close()


def read_shard(shard, ranges):
    """The samples of `ranges` (ascending (start, stop) pairs) of one tar shard, as webdataset's
    dicts, read front to back (a tar file has no index: samples before a range are passed over)."""
    ranges = iter(ranges)
    start, stop = next(ranges)
    with open(shard.path, "rb") as f:
        files = ({**member, "__url__": shard.path} for member in wds.tariterators.tar_file_iterator(f))
        for i, sample in enumerate(wds.tariterators.group_by_keys(files)):
            while i >= stop:
                start, stop = next(ranges, (None, None))
                if start is None:
                    return
            if i >= start:
                yield sample


def decoder(source, config, size: int, train: bool):
    """sample dict -> (x, y) or (x, y, id)."""
    index = source.index
    if index.kind == "tokens":
        def decode(sample):
            tokens = torch.from_numpy(np.frombuffer(sample["bin"], np.uint8).astype(np.int64))
            return (tokens[:-1], tokens[1:]) + ((int(sample["__key__"]),) if source.ids else ())
        return decode
    transform = images.transform(size, train and config.augment, index.mean, index.std)

    def decode(sample):  # type: ignore[no-redef]  # images' (the tokens' returned above)
        from PIL import Image
        ext = next(k for k in ("png", "jpg", "jpeg") if k in sample)
        try:
            with Image.open(io.BytesIO(sample[ext])) as image:
                x = transform(image.convert("RGB"))
        except Exception as e:
            raise ToolkitError(f"dataset={index.spec!r}: sample {sample['__key__']} of {sample.get('__url__', 'a shard')} "
                               f"cannot be decoded ({e.__class__.__name__}: {e}); write the shards again") from None
        return (x, int(sample["cls"])) + ((int(sample["__key__"]),) if source.ids else ())
    return decode


class _Batches(IterableDataset):
    def __init__(self, reads, shards, sizes, decode):
        self.reads, self.shards, self.sizes, self.decode = reads, shards, sizes, decode

    def __iter__(self):
        info = get_worker_info()
        me, workers = (info.id, info.num_workers) if info else (0, 1)
        records = self.reads.records(read_shard, self.shards)
        for m, size in enumerate(self.sizes):
            chunk = [next(records) for _ in range(size)]
            if m % workers == me:
                yield default_collate([self.decode(r) for r in chunk])


def batches(session, source, reads, sizes, size: int, train: bool):
    """The micro-batches of `sizes` samples of this rank's stream, on the session's device."""
    decode = decoder(source, session.config, size, train)
    workers = session.config.loader_workers
    loader = DataLoader(_Batches(reads, source.shards, sizes, decode), batch_size=None, num_workers=workers,
                        pin_memory=session.torch_device.type == "cuda")
    for batch in loader:
        yield tuple(session.to_device(v) for v in batch)
