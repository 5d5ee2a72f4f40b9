"""A session's loader: this process's micro-batches of a dataset, its position saved with checkpoints."""
from __future__ import annotations

from toolkit.run.data import Sampler


class Loader:
    """A session's loader: this process's micro-batches of a dataset, on the session's device.

    Iterating gives micro-batches `(x, y)`; `steps()` gives them grouped by optimizer step (the
    built-in trainer's use). Which samples: `toolkit.run.data.Sampler` (one permutation per epoch,
    strided by replica; its position is saved with the session's checkpoints)."""

    def __init__(self, session, data, sampler: Sampler, batches):
        self.session, self.data, self.sampler, self._batches = session, data, sampler, batches

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    def __len__(self) -> int:
        """Micro-batches in a whole epoch."""
        return self.sampler.steps_per_epoch * (self.sampler.k if self.sampler.train else 1)

    def steps(self):
        """The epoch's remaining optimizer steps, each a list of `accumulation_steps` micro-batches;
        the position moves on as each step is handed out."""
        plan = self.sampler.remaining()
        batches = self._batches(self.data, [idx for micro in plan for idx in micro], self.sampler)
        for micro in plan:
            step = [next(batches) for _ in micro]
            self.sampler.advance()
            yield step

    def __iter__(self):
        for batches in self.steps():
            yield from batches

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


class StreamLoader(Loader):
    """A session's loader of sharded streams (`shards:PATH`, `toolkit.shards(PATH)`): the same verbs;
    which samples: `toolkit.run.streams.StreamSampler` (its position, segments per world, is saved
    with the session's checkpoints). `batches(source, reads, sizes, train)`: the framework's reader."""

    def steps(self):
        s = self.sampler
        if not s.train:      # evaluation reads the whole split each time; its position does not move
            s.segments = []
        sizes = s.batch_sizes()
        if not sizes:
            return
        batches = self._batches(self.data, s.reads(), sizes, s.train)
        if not s.train:
            for _ in sizes:
                yield [next(batches)]
            return
        for _ in range(len(sizes) // s.k):
            step = [next(batches) for _ in range(s.k)]
            s.advance()
            yield step
