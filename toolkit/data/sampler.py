"""Which samples each replica takes from an in-memory dataset, step by step: one permutation per
epoch, strided by replica, its position saved with checkpoints (`Sampler`). Framework-free; numpy is
imported lazily. The sharded streams' counterpart: toolkit/data/stream_sampler.py.
"""
from __future__ import annotations


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


class Sampler:
    """Which samples this process's replicas take, optimizer step by optimizer step: the one sampling
    rule of the toolkit, behind every framework's `session.loader` (numpy, torch `Dataset`, Gluon
    `Dataset`; tf.data follows it with shuffle/shard/skip).

    Training: one permutation of the `n` samples per epoch (from `seed` and the epoch only, the
    same on every rank), taken `batch_size x accumulation_steps x world` positions per optimizer
    step (`step_indices`); the last partial step is dropped, so every replica runs the same number
    of steps. Progress is a position in that permutation (`state_dict`), so a resume or an elastic
    resize (`resize`) carries on without repeating or skipping a sample. Evaluation
    (`train=False`): the samples in order, replica r taking every `world`-th from r, nothing dropped.
    `shuffle=False` trains on the samples in their order, every epoch.
    """

    def __init__(self, n: int, batch_size: int, accumulation_steps: int = 1, world: int = 1,
                 replicas: range | None = None, seed: int = 0, train: bool = True, shuffle: bool = True):
        if n < 1:
            from toolkit.errors import ToolkitError
            raise ToolkitError("the dataset is empty: give the loader at least one sample")
        self.n, self.batch_size, self.k, self.seed = n, batch_size, accumulation_steps, seed
        self.train, self.shuffle = train, shuffle
        self.epoch, self.position = 0, 0
        self.resize(world, replicas if replicas is not None else range(1))

    def resize(self, world: int, replicas: range) -> None:
        """A new world (elastic training); the position in the epoch stays."""
        self.world, self.replicas = world, replicas

    @property
    def step_samples(self) -> int:
        return self.batch_size * self.k * self.world

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in a whole epoch (training), or batches of this replica (evaluation)."""
        if self.train:
            return self.n // self.step_samples
        share = len(range(self.replicas.start, self.n, self.world))
        return -(-share // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning (a resumed position is kept for the epoch it belongs to)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def order(self):
        import numpy as np
        return epoch_order(self.n, self.epoch, self.seed) if self.train and self.shuffle else np.arange(self.n)

    def remaining(self) -> list:
        """Each remaining optimizer step of the epoch: its `accumulation_steps` micro-batches of
        indices (each micro-batch holds this process's replicas' samples one after the other).
        Evaluation: this replica's batches, one micro-batch a step. The position does not move."""
        import numpy as np
        order = self.order()
        if not self.train:      # each batch: this process's replicas' next b samples one after the other
            shares, b = [order[r::self.world] for r in self.replicas], self.batch_size
            return [[np.concatenate([share[start:start + b] for share in shares])]
                    for start in range(0, self.steps_per_epoch * b, b)]
        out, position = [], self.position
        while steps_left(self.n, position, self.world, self.batch_size, self.k):
            out.append(step_indices(order, position, self.batch_size, self.k, self.world, self.replicas))
            position += self.step_samples
        return out

    def advance(self) -> None:
        """One optimizer step of the epoch handed out (training)."""
        if self.train:
            self.position += self.step_samples

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
