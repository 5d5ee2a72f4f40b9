"""Gradient exchanges, each written once on the array namespace of toolkit/exchange/arrays.py (torch
tensors on their device, or numpy), over the compressors of toolkit/exchange/compression.py: the
gathered exchange (bf16, int8, top-k), DGC, PowerSGD, error feedback; `make_exchange` is the one table
from the config to its exchange.

Two ways over the wire:
- **Gathered** (bf16, int8, top-k): payloads differ per rank (int8 scales, top-k positions), so they are exchanged
  with an allgather of raw bytes (top-k first allgathers its part lengths, which differ by rank), and every rank
  decompresses and sums every payload in rank order: the same result on every rank, bit for bit. bf16 cannot
  ride on Horovod's allreduce (Horovod 0.28.1 refuses bfloat16 tensors: torch "Tensor type
  torch.BFloat16Tensor is not supported", TensorFlow "Value for attr 'T' of bfloat16 is not in the list of
  allowed values"), nor can int8 (a sum of int8 values overflows); fp16 does, as Horovod's own compression.
- **PowerSGD** (Vogels et al. 2019) allreduces: a gradient matrix M (n x m, a tensor's first axis by
  the rest) becomes P = M Q (n x r), allreduced and orthonormalised, then Q = M^T P (m x r),
  allreduced; every rank rebuilds P Q^T. Q is warm-started from the previous step. Vectors and
  matrices too small to gain (n m < 2 r (n + m), torch's rule) travel uncompressed in the P
  allreduce. Its cost does not grow with the number of ranks, unlike an allgather's.

Error feedback (Seide et al. 2014; Stich et al. 2018; Karimireddy et al. 2019): each rank keeps what
compression dropped and adds it to the next step's gradient, so nothing is lost, only delayed:
`residual + sent == input` (to float32 rounding).

DGC (Lin et al. 2018, "Deep Gradient Compression"), on top of top-k: momentum correction (each rank
accumulates velocity u = m u + g and v += u, and sends the top-k of v, so the optimizer runs
without momentum), factor masking (u is zeroed where a matrix's v was sent, as v is; `dgc_masking`),
top-k per gradient matrix with vectors sent whole, local gradient clipping
(each rank clips its own gradient to clip_grad_norm / sqrt(N) before accumulating), and a density
warm-up (25% falling exponentially to the target over the first epochs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from toolkit.config import Compression, Op
from toolkit.exchange.arrays import Numpy
from toolkit.exchange.compression import ALIGN, INT8_BLOCK, Compressor, Timer, TopK, density, make


@dataclass
class GradientExchange:
    """Compress each rank's gradients, exchange them, return the mean (or sum) on every rank.

    `comm` is the session (adapters/base.py): `allgather(uint8 buffer)` concatenates the ranks'
    buffers, `allreduce(float32 buffer, average)` reduces them, both in the namespace `ops`.
    One step's gradients travel as one flat float32 buffer. `last_bytes` is what this rank handed
    to collectives in the last step: 0 at world size 1, where nothing crosses the wire (the method
    still runs, so a 1-rank job shows its effect and its cost).
    """
    compressor: Compressor
    error_feedback: bool
    average: bool = True                       # False: op sum (the sum of the ranks' mean gradients)
    ops: Numpy = None                          # type: ignore[assignment]  # None: the compressor's (__post_init__)
    residual: Any = None                       # flat float32, this rank's, when error_feedback
    calls: list = field(default_factory=list)  # the last step's collectives: (kind, bytes this rank handed over)
    form: str | None = None                    # bf16/int8: "allgather" or "reduce" (the model's choice at N)
    chosen_for: int | None = None              # the N `form` was chosen for; 0: set by hand (tests, the planner)
    owner_residual: Any = None                 # the compressed allreduce: what the second quantisation
    timer: Timer = field(init=False)           # dropped from this rank's own chunk (flat, zero elsewhere)

    def __post_init__(self):
        self.ops = self.ops or self.compressor.ops
        self.compressor.ops = self.ops
        self.timer = Timer(self.ops)
        self.spare = None           # the next step's flat buffer (the last residual's, or the last flat)
        self.total = None           # the sum of the ranks' payloads, reused every step
        self.chunk_compressor = None    # the compressed allreduce's second quantisation (its own buffers)

    @property
    def last_bytes(self) -> int:
        """What this rank handed to collectives in the last step (bytes_sent_per_step's meaning)."""
        return sum(b for _, b in self.calls)

    def buffer(self, n: int):
        """A buffer of n values for exchange_flat's input, this exchange's own (it may keep it as its residual)."""
        b, self.spare = self.spare, None
        return b if b is not None and len(b) == n else self.ops.empty(n)

    def _total(self, n: int):
        """The sum's buffer, reused every step; not zeroed: the first payload is set into it, not added."""
        if self.total is None or len(self.total) != n:
            self.total = self.ops.empty(n)
        return self.total

    def exchange(self, grads, comm, world_size: int) -> list:
        """The reduced gradients, shaped like `grads`: views into a buffer that the next exchange reuses."""
        n = sum(math.prod(self.ops.shape(g)) for g in grads)
        flat = self.ops.flatten(grads, out=self.buffer(n))
        return self.ops.unflatten(self.exchange_flat(flat, comm, world_size), grads)

    def exchange_flat(self, flat, comm, world_size: int):
        if self.compressor.name == "none":
            self.calls = [("allreduce", len(flat) * 4)] if world_size > 1 else []
            return comm.allreduce(flat, average=self.average) if world_size > 1 else flat
        n = len(flat)
        self.timer.start()
        if self.error_feedback and self.residual is not None:
            flat += self.residual
        payload = self.compressor.compress(flat)
        if self.error_feedback:
            self.compressor.subtract_sent(flat, payload)
            self.spare, self.residual = self.residual, flat
        else:
            self.spare = flat
        self.timer.stop()
        if world_size > 1 and self._reduces(n, world_size):
            return self._reduce(payload, n, comm, world_size)
        total = self._gather_and_sum(payload, n, comm, world_size)
        if self.average and world_size > 1:
            total /= world_size
        return total

    def state(self) -> dict:
        """This rank's flat float32 state for checkpoints (name -> buffer), or {}."""
        out = {"residuals": self.residual} if self.error_feedback and self.residual is not None else {}
        if self.error_feedback and self.owner_residual is not None:
            out["owner_residuals"] = self.owner_residual
        return out

    def load_state(self, state: dict) -> None:
        if "residuals" in state:
            self.residual = state["residuals"]
        if "owner_residuals" in state:
            self.owner_residual = state["owner_residuals"]

    # -- the compressed allreduce (bf16, int8) ------------------------------------------------------
    def _reduces(self, n: int, world_size: int) -> bool:
        """Whether this step takes the compressed allreduce rather than the allgather: bf16 and int8
        only, as the planner's model prices the two for this payload (toolkit/planner/scaling.py)."""
        if self.compressor.name in ("bf16", "int8") and self.chosen_for not in (0, world_size):
            self.choose_form(n, world_size)             # chosen again when an elastic job resizes
        return self.compressor.name in ("bf16", "int8") and self.form == "reduce"

    def choose_form(self, n: int, world_size: int) -> None:
        """The form (compressed allreduce or allgather) the model prices cheaper for n values at world_size
        (a bucket of a gradient takes its whole gradient's: toolkit/exchange/buckets.py)."""
        if self.compressor.name in ("bf16", "int8"):
            from toolkit.exchange import wire
            payload = n * (1 if self.compressor.name == "int8" else 2)
            self.form, self.chosen_for = wire.exchange_form(world_size, payload), world_size

    def chunks(self, n: int, world_size: int) -> list[tuple[int, int]]:
        """(start, end) of each rank's chunk of the flat buffer: N nearly equal parts whose starts are
        whole compression blocks (int8's scales then split with the values); empty ones when n is small."""
        block = INT8_BLOCK if self.compressor.name == "int8" else ALIGN // 2
        blocks = math.ceil(n / block)
        starts = [min(n, (j * blocks // world_size) * block) for j in range(world_size)]
        return list(zip(starts, starts[1:] + [n]))

    def _slice(self, payload, start: int, end: int):
        """The part of a whole-buffer payload that compressing flat[start:end] alone gives."""
        if self.compressor.name == "int8":
            q, scales = payload
            return q[start:end], scales[start // INT8_BLOCK:math.ceil(end / INT8_BLOCK)]
        return (payload[0][start:end],)

    def _part_bytes(self, size: int) -> int:
        """Bytes of one packed chunk of `size` values (each part padded to ALIGN)."""
        widths = {"int8": (1, 4), "bf16": (2,)}[self.compressor.name]
        lengths: list[int] = self.compressor.lengths(size)      # type: ignore[assignment]  # bf16, int8: never None
        return sum(c * w + (-c * w) % ALIGN for c, w in zip(lengths, widths))

    def _reduce(self, payload, n: int, comm, world_size: int):
        """The compressed allreduce: chunk j of every rank's payload goes to rank j (alltoall); rank j
        decompresses and sums them in rank order, averages, adds what its last second quantisation
        dropped (error feedback), compresses its reduced chunk again and keeps the new error; an
        allgather of the reduced chunks gives every rank the same compressed result, which every rank
        decompresses: replicas stay bit-identical. A rank sends 2(N-1)/N of the compressed size."""
        ops, me = self.ops, comm.rank
        chunks = self.chunks(n, world_size)
        start, end = chunks[me]
        mine = end - start
        parts = [self._pack(self._slice(payload, a, e))[1] for a, e in chunks]
        splits = [len(p) for p in parts]
        received = comm.alltoall(ops.cat(parts), splits)
        step = self._part_bytes(mine)
        dtypes = [part.dtype for part in payload]
        self.timer.start()
        if self.chunk_compressor is None:
            self.chunk_compressor = make(self.compressor.name, ops=ops)
        cc = self.chunk_compressor
        x = self._total(n)[:mine]
        for r in range(world_size):
            (cc.add_into if r else cc.set_into)(x, self._unpack(received, dtypes, cc.lengths(mine), r * step)[0], mine)
        if self.average:
            x /= world_size
        if self.error_feedback:
            if self.owner_residual is None or len(self.owner_residual) != n:
                self.owner_residual = ops.zeros(n)
            x += self.owner_residual[start:end]
        blob = ops.zeros(0, "uint8")           # an empty chunk (fewer values than ranks) sends nothing
        if mine:
            reduced = cc.compress(x)
            blob = self._pack(reduced)[1]
            if self.error_feedback:
                cc.subtract_sent(x, reduced)
                self.owner_residual[start:end] = x
        self.timer.stop()
        gathered = comm.allgather(blob)
        self.calls = [("alltoall", sum(splits)), ("allgather", len(blob))]
        self.timer.start()
        out, offset = self._total(n), 0
        for a, e in chunks:
            parts, offset = self._unpack(gathered, dtypes, cc.lengths(e - a), offset)
            if e > a:
                cc.set_into(out[a:e], parts, e - a)
        self.timer.stop()
        return out

    def _unpack(self, blob, dtypes, lengths, offset: int) -> tuple:
        """(the parts (of `dtypes`, `lengths` values) packed at byte `offset` of blob, the offset after them)."""
        parts = []
        for dtype, count in zip(dtypes, lengths):
            parts.append(self.ops.from_bytes(blob, dtype, count, offset))
            offset += count * self.ops.itemsize(dtype) + (-count * self.ops.itemsize(dtype)) % ALIGN
        return tuple(parts), offset

    def _pack(self, payload):
        """(header int32 lengths, one uint8 blob of the parts, each padded to ALIGN bytes)."""
        ops, parts = self.ops, []
        for part in payload:
            raw = ops.as_bytes(part)
            pad = -len(raw) % ALIGN
            parts.append(ops.cat([raw, ops.zeros(pad, "uint8")]) if pad else raw)
        lengths = ops.from_numpy(self.ops.np.array([len(p) for p in payload], self.ops.np.int32))
        return ops.as_bytes(lengths), ops.cat(parts)

    def _gather_and_sum(self, payload, n: int, comm, world_size: int):
        ops = self.ops
        if world_size == 1:
            self.calls = []
            self.timer.start()
            total = self._total(n)
            self.compressor.set_into(total, payload, n)
            self.timer.stop()
            return total
        dtypes = [part.dtype for part in payload]
        header, blob = self._pack(payload)
        fixed = self.compressor.lengths(n)
        if fixed is None:       # lengths differ by rank: one small allgather of them first
            self.calls = [("allgather", len(header)), ("allgather", len(blob))]
            lengths = ops.to_numpy(comm.allgather(header)).view("int32").reshape(world_size, len(payload))
        else:
            self.calls = [("allgather", len(blob))]
            lengths = ops.np.array([fixed] * world_size)
        blobs = comm.allgather(blob)
        self.timer.start()
        total, offset = self._total(n), 0
        for r in range(world_size):
            parts, offset = self._unpack(blobs, dtypes, [int(c) for c in lengths[r]], offset)
            (self.compressor.add_into if r else self.compressor.set_into)(total, parts, n)
        self.timer.stop()
        return total


@dataclass
class DGCExchange(GradientExchange):
    """Top-k with DGC's momentum correction, factor masking, local clipping and density warm-up.
    `residual` is DGC's accumulated velocity v; `momentum_buffer` is u."""
    momentum: float = 0.9
    clip_norm: float | None = None             # clip_grad_norm; each rank clips to clip_norm / sqrt(N)
    target_ratio: float = 0.01
    warmup_epochs: int = 4
    masking: bool = True                       # momentum factor masking (the paper's; measured in docs)
    epoch: int = 0                             # set by toolkit/exchange/communication.py before each step
    momentum_buffer: Any = None
    segments: list | None = None               # (start, size) of each gradient matrix, top-k'd on its own
    whole: Any = None                          # positions of the vectors' values, always sent

    def exchange(self, grads, comm, world_size: int) -> list:
        if self.segments is None:
            self._make_plan(grads)
        return super().exchange(grads, comm, world_size)

    def _make_plan(self, grads) -> None:
        """DGC selects layer by layer, and sends vectors (biases, normalisation scales) whole: they are
        small, and a global top-k can starve a layer whose gradients are small in magnitude."""
        ops, start, whole = self.ops, 0, []
        self.segments = []
        for g in grads:
            shape = ops.shape(g)
            size = math.prod(shape)
            if len(shape) >= 2:
                self.segments.append((start, size))
            else:
                whole.append(ops.np.arange(start, start + size, dtype=ops.np.int64))
            start += size
        self.whole = ops.from_numpy(ops.np.concatenate(whole) if whole else ops.np.zeros(0, ops.np.int64))

    def _select(self, v):
        ratio, ops = self.compressor.ratio, self.ops
        parts = []
        for start, size in self.segments:
            k = max(1, min(size, math.ceil(ratio * size)))
            parts.append(self.compressor.select(v[start:start + size], k, key=str(start)) + start)
        selected = ops.cat(parts) if parts else self.whole[:0]
        return selected, ops.sort(ops.cat([self.whole, selected])) if len(self.whole) else selected

    def exchange_flat(self, flat, comm, world_size: int):
        ops = self.ops
        topk: TopK = self.compressor                    # type: ignore[assignment]  # DGC's is top-k (make_exchange)
        self.timer.start()
        if self.clip_norm is not None:
            norm = math.sqrt(ops.dot(flat))
            limit = self.clip_norm / math.sqrt(world_size)
            if norm > limit:
                flat *= limit / (norm + 1e-6)
        if self.momentum_buffer is None:
            self.momentum_buffer, self.residual = ops.zeros(len(flat)), ops.zeros(len(flat))
        u, v = self.momentum_buffer, self.residual
        u *= self.momentum
        u += flat                                          # u = m u + g
        v += u                                             # v = v + u
        self.spare = flat
        topk.ratio = density(self.target_ratio, self.epoch, self.warmup_epochs)
        if self.segments is not None:
            masked, positions = self._select(v)
            payload = topk.encode(v, positions)
        else:
            payload = topk.compress(v)
            masked = topk.positions
        topk.subtract_sent(v, payload)                     # what was sent leaves v (bf16 rounding stays)
        if self.masking:
            u[masked] = 0                                  # momentum factor masking
        self.timer.stop()
        total = self._gather_and_sum(payload, len(flat), comm, world_size)
        if self.average and world_size > 1:
            total /= world_size
        return total

    def state(self) -> dict:
        if self.residual is None:
            return {}
        return {"residuals": self.residual, "momenta": self.momentum_buffer}

    def load_state(self, state: dict) -> None:
        if "residuals" in state and "momenta" in state:
            self.residual, self.momentum_buffer = state["residuals"], state["momenta"]


@dataclass
class PowerSGDExchange(GradientExchange):
    """PowerSGD rank `rank` through two allreduces per step (see the module's docstring)."""
    rank: int = 1
    warmup_steps: int = 0                      # steps allreduced whole first (torch's start_powerSGD_iter)
    step: int = 0                              # the global step, set by toolkit/exchange/communication.py
    shapes: list | None = None                 # the gradients' shapes, set at the first step
    q: Any = None                              # every compressed matrix's Q, one flat buffer
    # (start, rows, cols, compressed, q_start) per gradient, made at the first step
    plan: list = None                          # type: ignore[assignment]

    def _make_plan(self, grads) -> None:
        r, q_size, self.plan = self.rank, 0, []
        self.shapes = [self.ops.shape(g) for g in grads]
        start = 0
        for shape in self.shapes:
            size = math.prod(shape)
            rows = shape[0] if len(shape) >= 2 else 1
            cols = size // rows if rows else 0
            compressed = len(shape) >= 2 and 2 * r * (rows + cols) < rows * cols     # torch's _should_compress
            self.plan.append((start, rows, cols, compressed, q_size))
            q_size += cols * r if compressed else 0
            start += size
        if self.q is None or len(self.q) != q_size:     # else Q came from a checkpoint
            # the same random start on every rank (a fixed seed), as torch's hook does
            self.q = self.ops.random_normal(q_size, seed=0) if q_size else self.ops.zeros(0)

    def exchange(self, grads, comm, world_size: int) -> list:
        if self.plan is None or [self.ops.shape(g) for g in grads] != self.shapes:
            self._make_plan(grads)
        return super().exchange(grads, comm, world_size)

    def exchange_flat(self, flat, comm, world_size: int):
        if self.step < self.warmup_steps:       # dense, as torch's hook before start_powerSGD_iter
            self.calls = [("allreduce", len(flat) * 4)] if world_size > 1 else []
            self.spare = None
            return comm.allreduce(flat, average=self.average) if world_size > 1 else flat
        ops, r = self.ops, self.rank
        squeezed = [p for p in self.plan if p[3]]
        self.timer.start()
        if self.error_feedback and self.residual is not None:
            flat += self.residual
        ps = [ops.matrix(flat, s, rows, cols) @ ops.matrix(self.q, qs, cols, r) for s, rows, cols, _, qs in squeezed]
        dense = [flat[s:s + rows * cols] for s, rows, cols, c, _ in self.plan if not c]
        first = ops.cat([*(p.reshape(-1) for p in ps), *dense]) if ps or dense else ops.zeros(0)
        self.timer.stop()
        if world_size > 1:
            first = comm.allreduce(first, average=True)
        self.timer.start()
        if self.total is None or len(self.total) != len(flat):
            self.total = ops.empty(len(flat))
        out, offset, qs_new = self.total, 0, []          # every value of it is written below
        ps_reduced = []
        for (s, rows, cols, _, qs), p in zip(squeezed, ps):
            p = ops.orthonormal(first[offset:offset + rows * r].reshape(rows, r))
            ps_reduced.append(p)
            qs_new.append((ops.matrix(flat, s, rows, cols).T @ p).reshape(-1))
            offset += rows * r
        for s, rows, cols, c, _ in self.plan:
            if not c:
                out[s:s + rows * cols] = first[offset:offset + rows * cols]
                offset += rows * cols
        q = ops.cat(qs_new) if qs_new else ops.zeros(0)
        self.timer.stop()
        if world_size > 1 and len(q):
            q = comm.allreduce(q, average=True)
        self.timer.start()
        self.q = q
        for (s, rows, cols, _, qs), p in zip(squeezed, ps_reduced):
            ops.matmul(p, ops.matrix(q, qs, cols, r).T, out=ops.matrix(out, s, rows, cols))
        if self.error_feedback:
            flat -= out
            for s, rows, cols, c, _ in self.plan:
                if not c:
                    flat[s:s + rows * cols] = 0             # sent whole: nothing held back
            self.spare, self.residual = self.residual, flat
        else:
            self.spare = flat
        self.timer.stop()
        self.calls = [("allreduce", len(first) * 4)] + ([("allreduce", len(q) * 4)] if len(q) else [])
        self.calls = self.calls if world_size > 1 else []
        if not self.average:
            out *= world_size
        return out

    def state(self) -> dict:
        out = super().state()
        if self.q is not None:
            out["powersgd_q"] = self.q
        return out

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        if "powersgd_q" in state:
            self.q = state["powersgd_q"]


def make_exchange(config, ops) -> GradientExchange:
    """The toolkit's exchange for the config's compression (bf16, int8, topk, powersgd; DGC), in `ops`."""
    average, ef = config.op is not Op.SUM, bool(config.error_feedback)
    if config.compression is Compression.POWERSGD:
        return PowerSGDExchange(make("none", ops=ops), ef, average, rank=config.powersgd_rank,
                                warmup_steps=config.powersgd_warmup_steps)
    compressor = make(config.compression.value, config.topk_ratio, ops)
    if config.dgc:
        return DGCExchange(compressor, True, average, momentum=config.momentum, clip_norm=config.clip_grad_norm,
                           target_ratio=config.topk_ratio, warmup_epochs=config.dgc_warmup_epochs,
                           masking=config.dgc_masking)
    return GradientExchange(compressor, ef, average)
