"""Gradient compressors, each written once on the array namespace of toolkit/exchange/arrays.py (torch
tensors on their device, or numpy): none, bf16, int8 (a float32 scale per block of values), top-k (the
k largest magnitudes, their positions and values). A compressor turns one flat float32 buffer into a
payload of raw parts and back; how payloads cross the wire, error feedback, DGC and PowerSGD are the
exchanges' (toolkit/exchange/exchanges.py). `make` is the one table from a name to its compressor.
"""
from __future__ import annotations

import math
import time

from toolkit.exchange import arrays

INT8_BLOCK = 256      # values that share one float32 scale
ALIGN = 8             # payload parts are padded to 8 bytes so each can be viewed as its dtype in place
WARMUP_DENSITY = 0.25
SAMPLE = 100_000      # top-k: values sampled (a fixed stride) to estimate the selection threshold


class Compressor:
    """compress(flat float32) -> payload (tuple of arrays); add_into(total, payload, n) adds one
    rank's decompressed payload to a sum; subtract_sent(flat, payload) takes what was sent out of
    flat (error feedback's residual). Each keeps its work buffers from step to step (`buffer`): the
    payload it returns is overwritten by its next compress."""
    name = "none"

    def __init__(self, ops=None):
        self.ops = ops or arrays.numpy_ops()
        self.buffers = {}

    def buffer(self, name: str, n: int, dtype: str = "float32"):
        b = self.buffers.get(name)
        if b is None or len(b) != n or not str(b.dtype).endswith(dtype):
            b = self.buffers[name] = self.ops.empty(n, dtype)
        return b

    def compress(self, flat):
        return (flat,)

    def lengths(self, n: int) -> list[int] | None:
        """Every rank's payload part lengths when they follow from n alone (no header to exchange)."""
        return [n]

    def add_into(self, total, payload, n: int) -> None:
        total += payload[0]

    def set_into(self, total, payload, n: int) -> None:
        """total = the payload decompressed (the first rank's: no zeroing pass before it)."""
        total[:] = 0
        self.add_into(total, payload, n)

    def decompress(self, payload, n: int):
        out = self.ops.zeros(n)
        self.add_into(out, payload, n)
        return out

    def subtract_sent(self, flat, payload) -> None:
        flat -= self.decompress(payload, len(flat))


class BF16(Compressor):
    """bfloat16: 2 bytes a value, round to nearest even."""
    name = "bf16"

    def compress(self, flat):
        n = len(flat)
        return (self.ops.bf16_bits(flat, out=self.buffer("bits", n, "uint16"), scratch=self.buffer("scratch", n, "uint32")),)

    def add_into(self, total, payload, n: int) -> None:
        self.ops.bf16_add(total, payload[0], 1, work=self.buffer("values", n))

    def set_into(self, total, payload, n: int) -> None:
        self.ops.from_bf16_bits(payload[0], out=total)

    def subtract_sent(self, flat, payload) -> None:
        self.ops.bf16_add(flat, payload[0], -1, work=self.buffer("values", len(flat)))


class Int8(Compressor):
    """Symmetric int8 per block of INT8_BLOCK values, one float32 scale (max |x| / 127) per block."""
    name = "int8"

    def compress(self, flat):
        n = len(flat)
        blocks = math.ceil(n / INT8_BLOCK)
        q, scales = self.buffer("q", n, "int8"), self.buffer("scales", blocks)
        self.ops.int8_quantize(flat, INT8_BLOCK, q, scales, work=self.buffer("work", blocks * INT8_BLOCK))
        return q, scales

    def lengths(self, n: int) -> list[int]:
        return [n, math.ceil(n / INT8_BLOCK)]

    def add_into(self, total, payload, n: int) -> None:
        q, scales = payload
        self.ops.int8_add(total, q, scales, INT8_BLOCK, 1, work=self.buffer("values", n))

    def subtract_sent(self, flat, payload) -> None:
        q, scales = payload
        self.ops.int8_add(flat, q, scales, INT8_BLOCK, -1, work=self.buffer("values", len(flat)))


class TopK(Compressor):
    """The k = ceil(ratio * n) largest magnitudes: k position gaps and k bfloat16 values.

    Selection, as DGC does it: a threshold estimated on a strided sample of the magnitudes (at
    about twice the density), the candidates above it (one pass), then the exact top-k among them;
    when fewer than k pass, the exact top-k of all. Either way exactly the k largest.
    Positions travel as gaps from the previous kept position, uint8 when the mean gap (1 / ratio)
    fits in one (ratio >= 1/128: 3 bytes a kept value) and uint16 otherwise (4 bytes a kept value).
    A gap over the width's maximum is bridged by zero-valued filler entries. The width depends
    only on the ratio, which every rank shares, so every rank reads every payload the same way. At
    1% density that is about 1/130 of the dense float32 bytes, at 0.1% about 1/1000. bf16 rounding
    of the kept values, like the values not kept, goes to the error-feedback residual.
    """
    name = "topk"

    def __init__(self, ratio: float, ops=None):
        super().__init__(ops)
        self.ratio = ratio
        self.positions = None         # the last compress's kept positions (DGC masks them)

    @property
    def gap_dtype(self) -> str:
        return "uint8" if self.ratio >= 1 / 128 else "uint16"

    def k(self, n: int) -> int:
        return max(1, min(n, math.ceil(self.ratio * n)))

    def lengths(self, n: int) -> None:
        return None                   # filler entries make the length differ by rank

    def select(self, flat, k: int | None = None, key: str = ""):
        """Ascending positions of flat's k largest magnitudes (`key` names the work buffers: one set
        per tensor when DGC selects tensor by tensor)."""
        ops, n = self.ops, len(flat)
        k = k or self.k(n)
        mags = ops.abs(flat, out=self.buffer("mags" + key, n))
        if n < 4 * SAMPLE or 8 * k > n:
            return ops.topk_positions(mags, k)
        sample = mags[::n // SAMPLE]
        threshold = ops.kth_largest(sample, min(len(sample), math.ceil(2 * k * len(sample) / n)))
        candidates = ops.nonzero(ops.greater_equal(mags, threshold, out=self.buffer("mask" + key, n, "bool")))
        if len(candidates) < k:
            return ops.topk_positions(mags, k)
        return candidates[ops.topk_positions(mags[candidates], k)]

    def compress(self, flat):
        return self.encode(flat, self.select(flat))

    def encode(self, flat, idx):
        """The payload of flat's values at `idx` (ascending int64 positions)."""
        ops = self.ops
        limit = 255 if self.gap_dtype == "uint8" else 65535
        self.positions = idx
        gaps = ops.diff_from(idx, -1)                         # >= 1
        fillers = (gaps - 1) // limit                         # entries of gap `limit` before each real one
        real = ops.cumsum(fillers + 1) - 1                    # where each real entry lands
        count = int(real[-1]) + 1
        out_gaps = ops.full(count, limit, "int64")
        values = ops.zeros(count)
        out_gaps[real] = gaps - limit * fillers
        values[real] = flat[idx]
        return ops.astype(out_gaps, self.gap_dtype), ops.bf16_bits(values)

    def _positions_values(self, payload):
        gaps, values = payload
        return self.ops.cumsum(self.ops.astype(gaps, "int64")) - 1, self.ops.from_bf16_bits(values)

    def add_into(self, total, payload, n: int) -> None:
        positions, values = self._positions_values(payload)      # strictly increasing: no repeats
        total[positions] += values

    def subtract_sent(self, flat, payload) -> None:
        positions, values = self._positions_values(payload)
        flat[positions] -= values


def make(name: str, topk_ratio: float | None = None, ops=None) -> Compressor:
    if name == "topk":
        return TopK(topk_ratio, ops)           # type: ignore[arg-type]  # topk comes with its ratio (config.topk_ratio)
    return {"none": Compressor, "bf16": BF16, "int8": Int8}[name](ops)


def payload_bytes(payload) -> int:
    return int(sum(len(a) * a.dtype.itemsize for a in payload))


def density(target: float, epoch: int, warmup_epochs: int) -> float:
    """DGC's warm-up: 25% at epoch 0, falling exponentially to `target` at `warmup_epochs`."""
    if epoch >= warmup_epochs or target >= WARMUP_DENSITY:
        return target
    return WARMUP_DENSITY * (target / WARMUP_DENSITY) ** (epoch / warmup_epochs)


class Timer:
    """Seconds spent compressing and decompressing (queued device work waited for at each read)."""

    def __init__(self, ops):
        self.ops, self.seconds, self.t0 = ops, 0.0, None

    def start(self) -> None:
        self.ops.synchronize()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.ops.synchronize()
        self.seconds += time.perf_counter() - self.t0
