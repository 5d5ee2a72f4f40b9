"""The toolkit's exchange beside the backward pass: the flat gradient cut into buckets, each exchanged as
soon as the backward pass has made its gradients ready (torch's `register_post_accumulate_grad_hook`,
adapters/torch/overlap.py), on one exchange thread, while the backward pass goes on; the step waits for
the last bucket (as DDP's buckets and Horovod's hooks do).

A bucket is a range of the flat gradient (parameters in the model's order) whose ends are whole
compression blocks (int8's 256 values), about `bucket_mb` of float32 values. The backward pass makes the
last parameters' gradients ready first, so the buckets run from the end of the flat gradient to its
start. Every rank starts the buckets in that one order (a bucket ready early waits for those before it):
the collectives of a bucket meet the same bucket's on every rank, with Horovod's unnamed collectives and
torch.distributed's alike.

Each bucket has its own exchange (toolkit/exchange/exchanges.py, or the hierarchical one of
toolkit/exchange/hierarchy.py) on its range. Compression is per value (bf16) or per whole block (int8), so a
bucket compresses its values as the whole gradient's exchange would, and every rank ends with the same
values as without buckets; the ranks' share of the compressed allreduce's second quantisation falls on
other blocks (the form, allgather or compressed allreduce, is chosen for the whole gradient). The
residuals are saved as whole-gradient rows: the checkpoint has the shape it has without buckets.
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from toolkit.exchange.compression import INT8_BLOCK


def plan(sizes: list[int], cap: int, block: int = INT8_BLOCK) -> list[tuple[int, int]]:
    """(start, end) of each bucket of a flat gradient of parameters of `sizes` values, in the order the
    backward pass readies them (from the end): about `cap` values each, every start a multiple of `block`."""
    n = sum(sizes)
    cap = max(block, cap // block * block)
    out, end = [], n
    while end > 0:
        start = max(0, (math.ceil(end / block) - cap // block) * block)
        out.append((start, end))
        end = start
    return out


class _Seconds:
    """The buckets' compression time, read as one Timer (toolkit/exchange/compression.py) is."""

    def __init__(self, timers):
        self.timers = timers

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.timers)


class BucketedExchange:
    """One exchange per bucket of the flat gradient, started by `ready` from the backward pass's hooks.
    Communication (toolkit/exchange/communication.py) reads the same verbs and attributes as from one
    GradientExchange (exchange, calls, timer, compressor, error_feedback, form, state, load_state)."""

    def __init__(self, make, sizes: list[int], cap: int, ops) -> None:
        """`make(values)`: a bucket's exchange; `sizes`: the values of each parameter, in the flat order."""
        self.ops, self.sizes = ops, sizes
        self.offsets = [0]
        for s in sizes:
            self.offsets.append(self.offsets[-1] + s)
        self.n = self.offsets[-1]
        self.buckets = plan(sizes, cap)
        self.exchanges = [make(e - a) for a, e in self.buckets]
        # the parameters each bucket waits for (those that overlap its range)
        self.members = [[i for i, s in enumerate(sizes) if s and self.offsets[i] < e and self.offsets[i + 1] > a]
                        for a, e in self.buckets]
        self.calls: list = []
        self.early = 0      # buckets started by the backward pass's hooks (before the step), since the start
        self.timer = _Seconds([x.timer for x in self.exchanges])
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolkit-exchange")
        self._lock = threading.Lock()
        self._armed = False
        self._flat_out = None       # the reduced flat gradient, reused every step
        self._reset()

    # what Communication reads, the first bucket's (every bucket's exchange is made alike)
    @property
    def compressor(self):
        return self.exchanges[0].compressor

    @property
    def error_feedback(self) -> bool:
        return self.exchanges[0].error_feedback

    @property
    def form(self):
        return self.exchanges[0].form

    @property
    def inner(self):
        """A bucket's exchange (what kind of exchange runs per bucket)."""
        return self.exchanges[0]

    def _reset(self) -> None:
        self._left = [len(m) for m in self.members]
        self._filled = [None] * len(self.buckets)     # each bucket's input buffer, once a gradient was copied in
        self._futures: list[Future | None] = [None] * len(self.buckets)
        self._next = 0                                  # the next bucket to start, in ready order

    # -- the backward pass's side ---------------------------------------------------------------------
    def arm(self, on: bool) -> None:
        """Whether the coming backward pass is the step's last micro-batch (its hooks start the buckets)."""
        self._armed = on

    def ready(self, index: int, grad) -> None:
        """Parameter `index`'s gradient (the ops' array, its whole accumulated value) is final for this step."""
        if not self._armed:
            return
        for b in self._overlapping(index):
            self._copy(b, index, grad)
            self._left[b] -= 1
        while self._next < len(self.buckets) and self._left[self._next] == 0:
            self._submit(self._next)
            self.early += 1

    def _overlapping(self, index: int) -> list[int]:
        lo, hi = self.offsets[index], self.offsets[index + 1]
        return [b for b, (a, e) in enumerate(self.buckets) if lo < e and hi > a]

    def _input(self, b: int):
        if self._filled[b] is None:
            a, e = self.buckets[b]
            self._filled[b] = self.exchanges[b].buffer(e - a)
        return self._filled[b]

    def _copy(self, b: int, index: int, grad) -> None:
        a, e = self.buckets[b]
        lo, hi = self.offsets[index], self.offsets[index + 1]
        s, t = max(a, lo), min(e, hi)
        self._input(b)[s - a:t - a] = self.ops.ravel(grad)[s - lo:t - lo]

    def _submit(self, b: int) -> None:
        x, flat = self.exchanges[b], self._input(b)
        self._futures[b] = self._pool.submit(x.exchange_flat, flat, self._comm, self._world)
        self._next += 1

    # -- the step's side ------------------------------------------------------------------------------
    def bind(self, comm, world_size: int) -> None:
        """The collectives (the session) and world size the coming buckets run on; every bucket takes the
        form (compressed allreduce or allgather) chosen for the whole gradient."""
        if getattr(self, "_world", None) != world_size:
            for x in self.exchanges:
                x.choose_form(self.n, world_size)
        self._comm, self._world = comm, world_size

    def exchange(self, grads, comm, world_size: int) -> list:
        """The reduced gradients, shaped like `grads`: the buckets the hooks started, waited for; the rest
        (gradients no hook made ready: no hooks ran, or a parameter the loss did not reach) started now, in order."""
        ops = self.ops
        self.bind(comm, world_size)
        flat_grads = [ops.ravel(g) for g in grads]
        for b in range(self._next, len(self.buckets)):
            for i in self.members[b]:
                self._copy(b, i, flat_grads[i])
        while self._next < len(self.buckets):
            self._submit(self._next)
        out = self._out()
        calls: list = []
        try:
            for b, (a, e) in enumerate(self.buckets):
                out[a:e] = self._futures[b].result()     # type: ignore[union-attr]
                calls += self.exchanges[b].calls
        finally:
            self._reset()
        self.calls = calls
        return ops.unflatten(out, grads)

    def _out(self):
        if self._flat_out is None:
            self._flat_out = self.ops.empty(self.n)
        return self._flat_out

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- checkpoints: whole-gradient rows ------------------------------------------------------------------
    def state(self) -> dict:
        out: dict = {}
        for (a, e), x in zip(self.buckets, self.exchanges):
            for name, buf in x.state().items():
                if name not in out:
                    out[name] = self.ops.zeros(self.n)
                out[name][a:e] = buf
        return out

    def load_state(self, state: dict) -> None:
        for (a, e), x in zip(self.buckets, self.exchanges):
            x.load_state({name: self.ops.cat([row[a:e]]) for name, row in state.items()})
