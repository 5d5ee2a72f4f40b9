"""A session's loader: this process's micro-batches of a dataset, its position saved with checkpoints.
Framework-free: the session that makes one passes itself and its framework's batches in."""
from __future__ import annotations

from toolkit.data.sampler import Sampler


class Loader:
    """A session's loader: this process's micro-batches of a dataset, on the session's device.

    Iterating gives micro-batches `(x, y)`; `steps()` gives them grouped by optimizer step (the
    built-in trainer's use). Which samples: `toolkit.data.sampler.Sampler` (one permutation per epoch,
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
    which samples: `toolkit.data.stream_sampler.StreamSampler` (its position, segments per world, is saved
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


class ForeignSampler(Sampler):
    """A stream the toolkit did not shard: its position is the optimizer steps taken this epoch (the
    Sampler's world and step size; no permutation, no length)."""

    def __init__(self, batch_size: int, accumulation_steps: int, world: int, replicas: range, train: bool):
        self.batch_size, self.k, self.train = batch_size, accumulation_steps, train
        self.epoch, self.steps_done, self.n = 0, 0, None    # type: ignore[assignment]  # no length: a stream
        self.resize(world, replicas)

    @property
    def position(self) -> int:      # type: ignore[override]  # derived from the steps taken, never set
        return self.steps_done * self.step_samples

    steps_per_epoch = None          # type: ignore[assignment]  # unknown: a stream

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.steps_done = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "steps": self.steps_done}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.steps_done = int(state["epoch"]), int(state.get("steps", 0))


_SAID: set = set()


class ForeignLoader(Loader):
    """A user's own stream (a torch IterableDataset or WebDataset pipeline, a tf.data stream of unknown
    length, an iterable of samples for MXNet): every rank reads it as given, in micro-batches of the
    session's batch size. The toolkit did not shard it, so every-sample-once and an exact resume do
    not hold: it says so once, in one line, and trains. Steps end for every rank when one rank's
    stream runs out (they agree each step, a scalar collective), so no rank waits alone in an
    allreduce; a resume fast-forwards past the steps taken (exact only for a deterministic stream).
    `batches(data)`: the framework's micro-batches of the stream."""

    def __init__(self, session, data, sampler, batches):
        super().__init__(session, data, sampler, batches)
        kind = type(data).__name__
        if kind not in _SAID and session.is_main:
            _SAID.add(kind)
            from toolkit.messages import say
            say(0, f"toolkit: session.loader({kind}): a stream the toolkit did not shard, read as given on every "
                   "rank; every sample once per epoch and an exact resume hold only for shards (toolkit shards, then "
                   "toolkit.shards(PATH) or dataset shards:PATH)", False)

    def __len__(self):
        raise TypeError("a stream's loader has no length (the stream does not say how many samples it holds)")

    def steps(self):
        s = self.sampler
        batches, skip = self._batches(self.data), s.steps_done * s.k
        for _ in range(skip):
            if next(batches, None) is None:
                break
        while True:
            step = [b for b in (next(batches, None) for _ in range(s.k)) if b is not None]
            full = self.session.mean(1.0 if len(step) == s.k else 0.0, name="toolkit.stream_more") == 1.0
            if not full:
                return
            s.steps_done += 1
            yield step
