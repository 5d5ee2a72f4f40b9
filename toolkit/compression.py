"""Gradient compression written once, on numpy, for every framework: bf16, int8, top-k, error feedback.

What crosses the wire is the compressed payload itself: bf16 sends 2 bytes a value, int8 sends
1 byte a value plus one float32 scale per block, top-k sends k position gaps (uint8 or uint16)
and k bfloat16 values (see TopK).
Payloads differ per rank (int8 scales, top-k positions), so they are exchanged with an allgather
(the adapter's `allgather` of raw bytes, rows concatenated) and every rank decompresses all of them
and averages: the same result on every rank, bit for bit.

Error feedback (Seide et al. 2014; Stich et al. 2018; Karimireddy et al. 2019): each rank keeps,
per parameter, what compression dropped and adds it to the next step's gradient, so nothing is lost,
only delayed: `residual + sent == input` (to float32 rounding; exactly for what top-k did not keep).

numpy is imported lazily (no framework, no numpy at `import toolkit`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

INT8_BLOCK = 256      # values that share one float32 scale


class Compressor:
    """compress(flat float32) -> payload (tuple of arrays); decompress(payload, n) -> flat float32."""
    name = "none"

    def compress(self, flat):
        return (flat,)

    def decompress(self, payload, n: int):
        return payload[0]


class BF16(Compressor):
    """bfloat16 by round-to-nearest-even on the upper 16 bits of float32 (numpy has no bfloat16)."""
    name = "bf16"

    def compress(self, flat):
        import numpy as np
        bits = np.ascontiguousarray(flat, dtype=np.float32).view(np.uint32)
        rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
        return (((bits + rounding) >> 16).astype(np.uint16),)

    def decompress(self, payload, n: int):
        import numpy as np
        return (payload[0].astype(np.uint32) << 16).view(np.float32)


class Int8(Compressor):
    """Symmetric int8 per block of INT8_BLOCK values, one float32 scale (max |x| / 127) per block."""
    name = "int8"

    def compress(self, flat):
        import numpy as np
        n = len(flat)
        blocks = math.ceil(n / INT8_BLOCK)
        padded = np.zeros(blocks * INT8_BLOCK, np.float32)
        padded[:n] = flat
        padded = padded.reshape(blocks, INT8_BLOCK)
        scales = np.abs(padded).max(axis=1) / 127.0
        safe = np.where(scales > 0, scales, 1.0)
        q = np.clip(np.rint(padded / safe[:, None]), -127, 127).astype(np.int8)
        return q.reshape(-1)[:n], scales.astype(np.float32)

    def decompress(self, payload, n: int):
        import numpy as np
        q, scales = payload
        return (q.astype(np.float32) * np.repeat(scales, INT8_BLOCK)[:n]).astype(np.float32)


class TopK(Compressor):
    """The k = ceil(ratio * n) largest magnitudes: k position gaps and k bfloat16 values.

    Positions travel as gaps from the previous kept position, uint8 when the mean gap (1 / ratio)
    fits in one (ratio >= 1/128: 3 bytes a kept value) and uint16 otherwise (4 bytes a kept value).
    A gap over the width's maximum is bridged by zero-valued filler entries. The width depends
    only on the ratio, so every rank reads every other rank's payload the same way. At 1% density
    that is about 1/130 of the dense float32 bytes, at 0.1% about 1/1000. bf16 rounding of the
    kept values, like the values not kept, goes to the error-feedback residual.
    """
    name = "topk"

    def __init__(self, ratio: float):
        self.ratio = ratio
        self.gap_dtype = "uint8" if ratio >= 1 / 128 else "uint16"

    def k(self, n: int) -> int:
        return max(1, min(n, math.ceil(self.ratio * n)))

    def select(self, flat):
        """Sorted int64 positions of the k largest magnitudes."""
        import numpy as np
        k = self.k(len(flat))
        return np.sort(np.argpartition(np.abs(flat), len(flat) - k)[len(flat) - k:])

    def compress(self, flat):
        import numpy as np
        limit = int(np.iinfo(self.gap_dtype).max)
        idx = self.select(flat)
        gaps = np.diff(idx, prepend=-1)                       # >= 1
        fillers = (gaps - 1) // limit                         # entries of gap `limit` before each real one
        count = len(idx) + int(fillers.sum())
        out_gaps = np.full(count, limit, self.gap_dtype)
        values = np.zeros(count, np.float32)
        real = np.cumsum(fillers + 1) - 1                     # where each real entry lands
        out_gaps[real] = gaps - limit * fillers
        values[real] = flat[idx]
        return out_gaps, BF16().compress(values)[0]

    def decompress(self, payload, n: int):
        import numpy as np
        gaps, values = payload
        out = np.zeros(n, np.float32)
        positions = np.cumsum(gaps.astype(np.int64)) - 1
        np.add.at(out, positions, BF16().decompress((values,), len(values)))
        return out


def flatten(arrays):
    """One float32 vector of the arrays' values, in order (what one collective carries)."""
    import numpy as np
    return np.concatenate([np.asarray(a, np.float32).reshape(-1) for a in arrays])


def unflatten(flat, like) -> list:
    """`flat` cut back into arrays shaped (and typed) like `like`."""
    import numpy as np
    out, start = [], 0
    for a in like:
        size = int(np.prod(np.shape(a)))
        out.append(flat[start:start + size].reshape(np.shape(a)).astype(np.asarray(a).dtype, copy=False))
        start += size
    return out


def make(name: str, topk_ratio: float | None = None) -> Compressor:
    if name == "topk":
        return TopK(topk_ratio)
    return {"none": Compressor, "bf16": BF16, "int8": Int8}[name]()


def payload_bytes(payload) -> int:
    return int(sum(a.nbytes for a in payload))


@dataclass
class GradientExchange:
    """Compress each rank's gradients, exchange the payloads, return the mean (or sum) on every rank.

    `comm` is the adapter (adapters/base.py): `allgather(uint8 array)` concatenates the ranks'
    arrays along axis 0, `allreduce(array, average)` reduces them. One step's gradients travel as
    one flat buffer: a compressed payload is sent as its raw bytes, every part back to back (one
    allgather), after a small header of part lengths (one more), since lengths differ by rank.
    Uncompressed gradients (local SGD's warm-up) take one float32 allreduce.
    """
    compressor: Compressor
    error_feedback: bool
    average: bool = True                       # False: op sum (the sum of the ranks' mean gradients)
    residual: object = None                    # flat float32, this rank's, when error_feedback
    last_bytes: int = 0                        # what this rank sent in the last step

    def exchange(self, grads: Sequence, comm, world_size: int) -> list:
        import numpy as np
        flat = flatten(grads)
        n = len(flat)
        if self.compressor.name == "none":
            self.last_bytes = flat.nbytes
            out = comm.allreduce(flat, average=self.average) if world_size > 1 else flat
        else:
            if self.error_feedback:
                if self.residual is None:
                    self.residual = np.zeros(n, np.float32)
                flat = flat + self.residual
            payload = self.compressor.compress(flat)
            if self.error_feedback:
                self.residual = flat - self.compressor.decompress(payload, n)
            total = self._gather_and_sum(payload, n, comm, world_size)
            out = (total / world_size if self.average else total).astype(np.float32)
        return unflatten(out, grads)

    def _gather_and_sum(self, payload, n: int, comm, world_size: int):
        import numpy as np
        dtypes = [part.dtype for part in payload]
        header = np.array([len(part) for part in payload], np.int32).view(np.uint8)
        blob = np.concatenate([np.ascontiguousarray(part).view(np.uint8).reshape(-1) for part in payload])
        self.last_bytes = header.nbytes + blob.nbytes
        if world_size == 1:
            return self.compressor.decompress(payload, n).astype(np.float64)
        lengths = np.frombuffer(comm.allgather(header).tobytes(), np.int32).reshape(world_size, len(payload))
        blobs = comm.allgather(blob).tobytes()
        total, offset = np.zeros(n, np.float64), 0
        for r in range(world_size):
            parts = []
            for j, dtype in enumerate(dtypes):
                parts.append(np.frombuffer(blobs, dtype, count=int(lengths[r, j]), offset=offset))
                offset += int(lengths[r, j]) * dtype.itemsize
            total += self.compressor.decompress(tuple(parts), n)
        return total
