"""Sharded streams for MXNet: RecordIO shards (`.rec` with its `.idx`), written and read with
`mx.recordio.MXIndexedRecordIO` (the id in each record's header, the label too; toolkit/data/stream_sampler.py
says which samples each rank reads); images decoded with `mx.image.imdecode` and transformed by
`imagefolder:`'s transform (adapters/mxnet/images.py), tokens as `text:`. The index lets a rank seek to its
part of a shard."""
from __future__ import annotations

import mxnet as mx
import numpy as np

from toolkit.adapters.mxnet import images
from toolkit.errors import ToolkitError


def _idx(path) -> str:
    return str(path)[: -len(".rec")] + ".idx"


class Writer:
    def __init__(self, path):
        self._out, self._n = mx.recordio.MXIndexedRecordIO(_idx(path), str(path), "w"), 0

    def write(self, sample_id: int, label: int, payload: bytes, ext: str) -> None:
        self._out.write_idx(self._n, mx.recordio.pack(mx.recordio.IRHeader(0, float(label), sample_id, 0), payload))
        self._n += 1

    def close(self) -> None:
        self._out.close()


def read_shard(shard, ranges):
    """The packed records of `ranges` of one RecordIO shard, read at their offsets (its .idx)."""
    record = mx.recordio.MXIndexedRecordIO(_idx(shard.path), shard.path, "r")
    try:
        for start, stop in ranges:
            for i in range(start, stop):
                yield record.read_idx(i)
    finally:
        record.close()


def decoder(source, config, size: int, train: bool):
    index = source.index
    transform = images.transform(size, train and config.augment, index.mean, index.std)

    def decode(packed):
        header, payload = mx.recordio.unpack(packed)
        if index.kind == "tokens":
            tokens = np.frombuffer(payload, np.uint8).astype(np.int64)
            x, y = mx.nd.array(tokens[:-1], dtype=np.int64), mx.nd.array(tokens[1:], dtype=np.int64)
        else:
            try:
                x = transform(mx.image.imdecode(payload, flag=1))
            except Exception as e:
                raise ToolkitError(f"dataset={index.spec!r}: sample {int(header.id)} cannot be decoded "
                                   f"({e.__class__.__name__}); write the shards again") from None
            y = int(header.label)
        return (x, y, int(header.id)) if source.ids else (x, y)
    return decode


def batches(session, source, reads, sizes, size: int, train: bool):
    """The micro-batches of `sizes` samples of this rank's stream, on the session's context."""
    decode = decoder(source, session.config, size, train)
    batchify = mx.gluon.data.dataloader.default_batchify_fn
    records = reads.records(read_shard, source.shards)
    for n in sizes:
        batch = batchify([decode(next(records)) for _ in range(n)])
        yield [session.to_device(v) for v in batch]
