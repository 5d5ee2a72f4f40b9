"""tf.data for the TensorFlow sessions (numpy arrays are indexed by the session itself). A
`tf.data.Dataset` (elements `(x, y)`, any tuple, or a dict) cannot be indexed, so it is shuffled (same seed
on every rank, so every rank sees the same order), sharded by replica, batched and skipped to the
sampler's position: every sample once per epoch across the replicas, the same strided layout as
the sampler's (replica r takes every world-th sample), and a resume mid-epoch carries on.
"""
from __future__ import annotations

import codecs
import re

import tensorflow as tf

from toolkit.errors import ToolkitError

SHUFFLE_BUFFER = 10_000      # tf.data samples shuffled together (the whole dataset when smaller)
ERROR = ("<toolkit-error>", "</toolkit-error>")     # brackets a ToolkitError's line in a tf.data error


def error_line(*parts):
    """A string tensor (the parts joined) for a `tf.debugging.Assert` in a dataset's map: tf.data
    stops with a multi-line InvalidArgumentError, which batches() turns back into this one line
    (adapters/tensorflow/images.py names an unreadable file so)."""
    return tf.strings.join([ERROR[0], *parts, ERROR[1]])


def length(data) -> int | None:
    """Samples in a tf.data.Dataset (None for anything else); one that does not know is refused."""
    if not isinstance(data, tf.data.Dataset):
        return None
    n = int(data.cardinality())
    if n < 0:
        raise ToolkitError("session.loader(data): this tf.data.Dataset does not know its length (infinite or "
                           "unknown cardinality); give it one: "
                           "dataset.apply(tf.data.experimental.assert_cardinality(N))")
    return n


def batches(data, plan, sampler):
    """Each micro-batch of `plan` as tf.data batches it, its structure kept: a tuple of any arity or
    a dict of tensors, as the dataset's elements are (on the default device; Keras places them).
    Several replicas in this process (mirrored): their shards' batches joined leaf by leaf."""
    b, world = sampler.batch_size, sampler.world
    ds = data
    if sampler.train and sampler.shuffle:
        ds = ds.shuffle(min(sampler.n, SHUFFLE_BUFFER), seed=sampler.seed + 1_000_003 * (sampler.epoch + 1),
                        reshuffle_each_iteration=False)
    shards = [ds.shard(world, r).batch(b, drop_remainder=sampler.train) for r in sampler.replicas]
    ds = shards[0] if len(shards) == 1 else tf.data.Dataset.zip(tuple(shards)).map(
        lambda *parts: tf.nest.map_structure(lambda *leaves: tf.concat(leaves, 0), *parts))
    done = sampler.position // (b * world) if sampler.train else 0     # micro-batches already trained
    try:
        yield from ds.skip(done).take(len(plan)).prefetch(tf.data.AUTOTUNE)
    except tf.errors.InvalidArgumentError as e:
        line = re.search(f"{ERROR[0]}(.*?){ERROR[1]}", e.message, re.S)
        if line is None:
            raise
        # the assertion's message is C-escaped (\' for ', octal bytes for UTF-8)
        raise ToolkitError(codecs.escape_decode(line.group(1).encode())[0].decode("utf-8", "replace")) from None
