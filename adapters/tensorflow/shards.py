"""Sharded streams for TensorFlow: TFRecord shards of `tf.train.Example`s (id, label, data), written
with `tf.io.TFRecordWriter` and read with `tf.data.TFRecordDataset` (toolkit/data/stream_sampler.py says which
samples each rank reads, in which order); reordered, decoded, resized and augmented in tf.data as
`imagefolder:` is (adapters/tensorflow/images.py), tokens as `text:`. No Python runs per record: a
generator feeding tf.data held the GIL beside the training step and cost a third of the training
rate (benchmarks/loader_bench.py, 2026-11-26)."""
from __future__ import annotations

import tensorflow as tf

from toolkit.adapters.tensorflow import images
from toolkit.errors import ToolkitError


class Writer:
    def __init__(self, path):
        self._out = tf.io.TFRecordWriter(str(path))

    def write(self, sample_id: int, label: int, payload: bytes, ext: str) -> None:
        feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[sample_id])),
                   "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                   "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[payload]))}
        self._out.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    def close(self) -> None:
        self._out.close()


_FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
             "data": tf.io.FixedLenFeature([], tf.string)}


def records(source, reads):
    """This rank's serialized records in the stream's order, all in tf.data (no Python per record): the
    pieces read with TFRecordDataset's skip/take, cut into the plan's windows, each reordered by its
    permutation with a gather, the consumed part of the first window skipped."""
    import numpy as np
    pieces = [(source.shards[shard].path, start, stop - start) for shard, ranges in reads.pieces
              for start, stop in ranges]
    if not pieces:
        return tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string))
    paths, starts, counts = (list(column) for column in zip(*pieces))
    raw = tf.data.Dataset.from_tensor_slices((paths, tf.constant(starts, tf.int64), tf.constant(counts, tf.int64)))
    raw = raw.flat_map(lambda path, start, count: tf.data.TFRecordDataset(path).skip(start).take(count))
    lengths = [len(order) for order in reads.windows]
    orders = tf.RaggedTensor.from_row_lengths(np.concatenate(reads.windows).astype(np.int64), lengths)
    # windows are consecutive runs of the stream (all of reads.windows[0]'s length but perhaps the last)
    windows = raw.batch(lengths[0])
    ordered = tf.data.Dataset.zip((windows, tf.data.Dataset.from_tensor_slices(orders)))
    return ordered.map(lambda window, order: tf.gather(window, order)).unbatch().skip(reads.skip)


def dataset(source, config, reads, size: int, train: bool):
    """This rank's stream as an unbatched tf.data.Dataset of (x, y) or (x, y, id)."""
    index = source.index
    records_ = records(source, reads)

    def image(data):
        x = tf.io.decode_image(data, channels=3, expand_animations=False)
        x = tf.image.resize(x, (size, size))
        return images.normalised(images.crop_flip(x, size) if train and config.augment else x, index.mean, index.std)

    def decode(record):
        sample = tf.io.parse_single_example(record, _FEATURES)
        if index.kind == "tokens":
            tokens = tf.cast(tf.io.decode_raw(sample["data"], tf.uint8), tf.int64)
            x, y = tokens[:-1], tokens[1:]
        else:
            x, y = image(sample["data"]), sample["label"]
        return (x, y, sample["id"]) if source.ids else (x, y)

    return records_.map(decode, num_parallel_calls=tf.data.AUTOTUNE)


def batches(session, source, reads, sizes, size: int, train: bool):
    """The micro-batches of `sizes` samples (every one `sizes[0]` but perhaps the last) of this rank's stream."""
    ds = dataset(source, session.config, reads, size, train).batch(sizes[0]).prefetch(tf.data.AUTOTUNE)
    try:
        yield from ds.take(len(sizes))
    except tf.errors.InvalidArgumentError as e:
        raise ToolkitError(f"dataset={source.index.spec!r}: a sample cannot be decoded ({e.message.splitlines()[0]}); "
                           "write the shards again") from None
