"""Built-in datasets as numpy arrays, and the one way they are split across ranks.

`digits` is the real 8x8 handwritten digits set that scikit-learn ships (1797 images, no
download); `synthetic` is a learnable linear-teacher problem. numpy is imported lazily.
"""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.config import Config, Dataset


@dataclass(frozen=True)
class Data:
    x_train: "object"   # float32 [n, features]
    y_train: "object"   # int64 [n]
    x_test: "object"
    y_test: "object"
    num_classes: int

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])


def load(config: Config) -> Data:
    import numpy as np

    if config.dataset is Dataset.DIGITS:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.data / 16.0).astype(np.float32)
        y = bunch.target.astype(np.int64)
        classes = 10
    else:
        teacher = np.random.RandomState(1234)
        x = teacher.standard_normal((4096, 64)).astype(np.float32)
        w = teacher.standard_normal((64, 10)).astype(np.float32)
        y = np.argmax(x @ w, axis=1).astype(np.int64)
        classes = 10
    order = np.random.RandomState(0).permutation(len(x))   # fixed split, independent of --seed
    cut = int(len(x) * 0.8)
    train, test = order[:cut], order[cut:]
    return Data(x[train], y[train], x[test], y[test], classes)


def epoch_order(n: int, epoch: int, seed: int):
    """The epoch's global permutation of the training samples, the same on every rank."""
    import numpy as np

    return np.random.RandomState(seed + 1_000_003 * (epoch + 1)).permutation(n)


def epoch_shard(n: int, epoch: int, seed: int, rank: int, size: int):
    """Indices of this rank's training samples for `epoch`.

    One global permutation per epoch (same on every rank), cut to a multiple of `size`, then
    strided: rank r takes positions r, r+size, ... So micro-batch j of step s on all ranks
    together is one contiguous block of the global permutation, and `size` ranks x
    `accumulation_steps` k x batch b see exactly the samples 1 rank x batch size*k*b sees.
    """
    order = epoch_order(n, epoch, seed)
    return order[: n - n % size][rank::size]


def step_indices(order, position: int, batch_size: int, accumulation_steps: int, size: int, replicas):
    """The micro-batches of one optimizer step starting at `position` of the epoch's `order`.

    Micro-batch j is the block order[position + j*b*size : position + (j+1)*b*size]; replica r takes
    every size-th sample of it from r on (the same samples `epoch_shard` gives rank r when
    position is a multiple of b*k*size). Progress is a position in the permutation, so the
    epoch carries on without repeating or skipping a sample when `size` changes (elastic training).
    Each micro-batch holds the replicas' samples one after the other.
    """
    import numpy as np

    b, k = batch_size, accumulation_steps
    blocks = (order[position + j * b * size: position + (j + 1) * b * size] for j in range(k))
    return [np.concatenate([block[r::size] for r in replicas]) for block in blocks]


def steps_left(n: int, position: int, size: int, batch_size: int, accumulation_steps: int) -> int:
    """Full optimizer steps of `size` replicas that still fit in the epoch after `position`."""
    return (n - position) // (batch_size * accumulation_steps * size)


def steps_per_epoch(n: int, size: int, batch_size: int, accumulation_steps: int) -> int:
    return (n // size) // (batch_size * accumulation_steps)
