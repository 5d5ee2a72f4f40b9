"""The array namespace the gradient exchange is written on: the few operations it needs, on numpy
arrays or on torch tensors on their own device.

toolkit/exchange/compression.py implements each method (bf16, int8, top-k, DGC, PowerSGD) once, calling
only these. A session says which namespace its gradients live in (`Session.array_ops`): torch's
gradients stay torch tensors on the rank's device (no host copy on a GPU, torch's own kernels on
the CPU), TensorFlow's and MXNet's arrive as numpy (the CPU fallback: on a GPU they cross to the
host; see docs/COMMUNICATION.md). Every operation is whole-buffer and vectorised: the step's
gradients travel as one flat float32 buffer (small tensors fused), with no Python loop per value.

Neither numpy nor torch is imported at `import toolkit`: each namespace imports its library when
it is made.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:                       # for annotations only: `import toolkit` imports no numpy
    import numpy


class Numpy:
    """numpy arrays on the host."""
    name = "numpy"

    def __init__(self):
        import numpy as np
        self.np = np

    # -- buffers ---------------------------------------------------------------------------------
    def flatten(self, arrays, out=None):
        """One float32 buffer of the arrays' values, in order (what one collective carries), written
        into `out` when given (a buffer reused step after step: no new memory to fault in)."""
        np = self.np
        parts = [np.asarray(a).reshape(-1) for a in arrays]
        return np.concatenate(parts, out=out) if out is not None else np.concatenate(parts, dtype=np.float32)

    def unflatten(self, flat, like) -> list:
        """`flat` cut back into arrays shaped (and typed) like `like`."""
        out, start = [], 0
        for a in like:
            size = math.prod(self.shape(a))
            out.append(self.astype(flat[start:start + size].reshape(self.shape(a)), self.dtype_of(a)))
            start += size
        return out

    def shape(self, a) -> tuple:
        return tuple(self.np.shape(a))

    def dtype_of(self, a):
        return self.np.asarray(a).dtype

    def zeros(self, n, dtype="float32"):
        return self.np.zeros(n, dtype)

    def empty(self, n, dtype="float32"):
        return self.np.empty(n, dtype)

    def full(self, n, value, dtype):
        return self.np.full(n, value, dtype)

    def astype(self, x, dtype):
        return x.astype(dtype, copy=False)

    def to_numpy(self, x):
        return self.np.asarray(x)

    def asarray(self, x):
        """x in this namespace (a CPU torch tensor becomes a numpy view of the same memory)."""
        return self.np.asarray(x)

    def ravel(self, x):
        """x as a 1-D array of its values (a view where x is contiguous)."""
        return self.asarray(x).reshape(-1)

    def from_numpy(self, a):
        return self.np.array(a)

    def cat(self, parts):
        return self.np.concatenate(parts)

    # -- bytes on the wire -----------------------------------------------------------------------
    def as_bytes(self, x):
        return self.np.ascontiguousarray(x).view(self.np.uint8).reshape(-1)

    def from_bytes(self, buffer, dtype, count: int, offset: int):
        """`count` values of `dtype` from the uint8 buffer at byte `offset`."""
        size = self.np.dtype(dtype).itemsize
        return buffer[offset:offset + count * size].view(dtype)

    def itemsize(self, dtype) -> int:
        return self.np.dtype(dtype).itemsize

    # -- arithmetic ------------------------------------------------------------------------------
    def abs(self, x, out=None):
        return self.np.abs(x, out=out)

    def greater_equal(self, x, value, out=None):
        return self.np.greater_equal(x, value, out=out)

    def nonzero(self, mask):
        """Ascending int64 positions where mask is true."""
        return self.np.flatnonzero(mask)

    def kth_largest(self, x, k: int) -> float:
        return float(self.np.partition(x, len(x) - k)[len(x) - k])

    def cumsum(self, x):
        return self.np.cumsum(x)

    def dot(self, x) -> float:
        """sum(x * x) as a host float: BLAS's dot in x's own precision (a float64 copy of a 40 MB
        gradient cost more than the rest of the exchange's pass over it)."""
        return float(self.np.dot(x, x))

    def clip_by_norm(self, grads: list, max_norm: float | None) -> tuple[list, float]:
        """(grads scaled so their global L2 norm is at most max_norm (torch's clip_grad_norm_ rule), the norm
        before): the norm from dot products in float32, summed as host floats."""
        from toolkit.exchange import numerics
        norm = math.sqrt(sum(self.dot(g.reshape(-1)) for g in grads))
        if (factor := numerics.clip_factor(norm, max_norm)) is not None:
            grads = [g * factor for g in grads]
        return grads, norm

    def topk_positions(self, magnitudes, k: int):
        """Ascending int64 positions of the k largest values."""
        np = self.np
        n = len(magnitudes)
        return np.sort(np.argpartition(magnitudes, n - k)[n - k:]).astype(np.int64)

    def sort(self, x):
        return self.np.sort(x)

    def diff_from(self, positions, start: int):
        """positions[i] - positions[i-1], with positions[-1] taken as `start`."""
        return self.np.diff(positions, prepend=start)

    def bf16_bits(self, x, out=None, scratch=None):
        """float32 -> bfloat16 bit patterns (uint16), round to nearest even (numpy has no bfloat16),
        in place in `scratch` (uint32, len(x)) and `out` when given."""
        np = self.np
        bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
        w = scratch if scratch is not None else np.empty(len(bits), np.uint32)
        np.right_shift(bits, 16, out=w)
        np.bitwise_and(w, 1, out=w)
        np.add(w, 0x7FFF, out=w)
        np.add(w, bits, out=w)
        np.right_shift(w, 16, out=w)
        out = out if out is not None else np.empty(len(bits), np.uint16)
        np.copyto(out, w, casting="unsafe")
        return out

    def from_bf16_bits(self, bits, out=None):
        np = self.np
        out = out if out is not None else np.empty(len(bits), np.float32)
        as_int = out.view(np.uint32)
        np.copyto(as_int, bits, casting="unsafe")
        np.left_shift(as_int, 16, out=as_int)
        return out

    def bf16_add(self, total, bits, alpha: int = 1, work=None) -> None:
        """total += alpha * (bits as float32), alpha 1 or -1 (`work`: a float32 buffer of len(bits))."""
        values = self.from_bf16_bits(bits, out=work)
        if alpha > 0:
            total += values
        else:
            total -= values

    # -- int8 blocks: a float32 scale (max |x| / 127) per `block` values, the last block short ------
    def int8_quantize(self, flat, block: int, q, scales, work) -> None:
        """q (int8, len(flat)) = round(x / scale), scales (float32, ceil(n / block)); a block of zeros
        gets scale 0 and q 0. `work`: float32, ceil(n / block) * block values."""
        np, n = self.np, len(flat)
        blocks = len(scales)
        padded = work[:blocks * block]
        padded[:n] = flat
        padded[n:] = 0
        rows = padded.reshape(blocks, block)
        np.maximum(rows.max(axis=1), -rows.min(axis=1), out=scales)     # max |x| without an |x| buffer
        scales /= 127.0
        rows /= np.where(scales > 0, scales, 1.0).reshape(blocks, 1)      # (x * (1 / tiny scale): 0 * inf)
        np.clip(np.rint(padded, out=padded), -127, 127, out=padded)
        q[:] = padded[:n]

    def int8_add(self, total, q, scales, block: int, alpha: int = 1, work=None) -> None:
        """total += alpha * q * scale of each value's block, alpha 1 or -1 (`work`: float32, len(q))."""
        np, n = self.np, len(q)
        full = n // block * block
        values = work[:n] if work is not None else np.empty(n, np.float32)
        np.multiply(q[:full].reshape(-1, block), scales[:full // block].reshape(-1, 1),
                    out=values[:full].reshape(-1, block))
        if n > full:
            np.multiply(q[full:], scales[-1], out=values[full:])
        if alpha > 0:
            total += values
        else:
            total -= values

    # -- PowerSGD --------------------------------------------------------------------------------
    def matrix(self, flat, start: int, rows: int, cols: int):
        """A view of flat[start:start + rows * cols] as a rows x cols matrix."""
        return flat[start:start + rows * cols].reshape(rows, cols)

    def matmul(self, a, b, out=None):
        return self.np.matmul(a, b, out=out)

    def orthonormal(self, p):
        """Orthonormal columns spanning p's (reduced QR)."""
        return self.np.linalg.qr(p)[0].astype(self.np.float32)

    def random_normal(self, n: int, seed: int):
        """The same n standard normal float32 values on every rank (seeded on the host)."""
        return self.np.random.RandomState(seed).standard_normal(n).astype(self.np.float32)

    def synchronize(self) -> None:
        """Wait for queued device work (timing); nothing to wait for on the host."""


class Torch(Numpy):
    """torch tensors on `device` (the rank's GPU, or the CPU)."""
    name = "torch"

    def __init__(self, device):
        super().__init__()
        import torch
        self.torch, self.device = torch, torch.device(device)

    def _dtype(self, dtype):
        return getattr(self.torch, str(dtype)) if not isinstance(dtype, self.torch.dtype) else dtype

    def flatten(self, arrays, out=None):
        torch = self.torch
        parts = [torch.as_tensor(a).reshape(-1).to(self.device, torch.float32) for a in arrays]
        return torch.cat(parts, out=out) if out is not None else torch.cat(parts)

    def shape(self, a) -> tuple:
        return tuple(a.shape)

    def dtype_of(self, a):
        return a.dtype

    def zeros(self, n, dtype="float32"):
        return self.torch.zeros(n, dtype=self._dtype(dtype), device=self.device)

    def empty(self, n, dtype="float32"):
        return self.torch.empty(n, dtype=self._dtype(dtype), device=self.device)

    def full(self, n, value, dtype):
        return self.torch.full((n,), value, dtype=self._dtype(dtype), device=self.device)

    def astype(self, x, dtype):
        return x.to(self._dtype(dtype))

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def asarray(self, x):
        return self.torch.as_tensor(x, device=self.device)

    def from_numpy(self, a):
        return self.torch.from_numpy(self.np.ascontiguousarray(a)).to(self.device)

    def cat(self, parts):
        return self.torch.cat(list(parts))

    def as_bytes(self, x):
        return x.contiguous().view(self.torch.uint8).reshape(-1)

    def from_bytes(self, buffer, dtype, count: int, offset: int):
        dtype = self._dtype(dtype)
        size = self.itemsize(dtype)
        return buffer[offset:offset + count * size].view(dtype)

    def itemsize(self, dtype) -> int:
        return self._dtype(dtype).itemsize

    def abs(self, x, out=None):
        return self.torch.abs(x, out=out) if out is not None else x.abs()

    def greater_equal(self, x, value, out=None):
        return self.torch.ge(x, value, out=out) if out is not None else x >= value

    def nonzero(self, mask):
        if self.device.type == "cpu":       # numpy's nonzero on the same memory (torch's: ~4x slower here)
            return self.torch.from_numpy(super().nonzero(mask.numpy()))
        return mask.nonzero().reshape(-1)

    def kth_largest(self, x, k: int) -> float:
        if self.device.type == "cpu":       # numpy's selection on the same memory (torch's topk: ~2x slower here)
            return super().kth_largest(x.numpy(), k)
        return float(self.torch.topk(x, k, sorted=False).values.min())

    def cumsum(self, x):
        return x.cumsum(0)

    def dot(self, x) -> float:
        return float(self.torch.dot(x, x))

    def clip_by_norm(self, grads: list, max_norm: float | None) -> tuple[list, Any]:
        """On the device, no host read (torch's get_total_norm and clip_grads_with_norm_ rule): the norm is a
        0-d tensor; the factor min(1, max_norm / (norm + 1e-6)) is applied whatever it is (a non-finite
        norm leaves the gradients as they are: the NaN guard stops the job)."""
        torch = self.torch
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.reshape(-1)) for g in grads]))
        if max_norm is None:
            return grads, norm
        factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        factor = torch.where(torch.isfinite(factor), factor, torch.ones_like(factor))
        return [g * factor for g in grads], norm

    def topk_positions(self, magnitudes, k: int):
        if self.device.type == "cpu":       # as kth_largest: numpy's argpartition on the same memory
            return self.torch.from_numpy(super().topk_positions(magnitudes.numpy(), k))
        return self.torch.topk(magnitudes, k, sorted=False).indices.sort().values

    def sort(self, x):
        return x.sort().values

    def diff_from(self, positions, start: int):
        return self.torch.diff(positions, prepend=positions.new_tensor([start]))

    def bf16_bits(self, x, out=None, scratch=None):
        if out is None:
            return x.to(self.torch.bfloat16).view(self.torch.uint16)
        out.view(self.torch.bfloat16).copy_(x)
        return out

    def from_bf16_bits(self, bits, out=None):
        if out is None:
            return bits.view(self.torch.bfloat16).to(self.torch.float32)
        return out.copy_(bits.view(self.torch.bfloat16))

    def int8_quantize(self, flat, block: int, q, scales, work) -> None:
        torch, n = self.torch, len(flat)
        full = n // block * block
        parts = [(flat[:full].view(-1, block), q[:full].view(-1, block), scales[:full // block])]
        if n > full:
            parts.append((flat[full:].view(1, -1), q[full:].view(1, -1), scales[full // block:]))
        for x, qx, sx in parts:     # (mixed-dtype and norm kernels measured 3-15x slower on the CPU here)
            torch.maximum(x.amax(dim=1), x.amin(dim=1).neg_(), out=sx)     # max |x| without an |x| buffer
            sx /= 127.0
            y = torch.div(x, torch.where(sx > 0, sx, 1.0).view(-1, 1), out=work[:x.numel()].view_as(x))
            y.round_().clamp_(-127, 127)
            qx.copy_(y)

    def int8_add(self, total, q, scales, block: int, alpha: int = 1, work=None) -> None:
        n = len(q)
        full = n // block * block
        values = work[:n].copy_(q)            # int8 -> float32 first: torch's mixed-dtype addcmul is slower
        total[:full].view(-1, block).addcmul_(values[:full].view(-1, block), scales[:full // block].view(-1, 1),
                                             value=alpha)              # dequantise and add in one pass
        if n > full:
            total[full:].addcmul_(values[full:], scales[-1:], value=alpha)

    def matmul(self, a, b, out=None):
        return self.torch.matmul(a, b, out=out) if out is not None else a @ b

    def orthonormal(self, p):
        return self.torch.linalg.qr(p).Q

    def random_normal(self, n: int, seed: int):
        return self.from_numpy(super().random_normal(n, seed))

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


NUMPY: "Numpy | None" = None


def numpy_ops() -> Numpy:
    global NUMPY
    if NUMPY is None:
        NUMPY = Numpy()
    return NUMPY


def of(session) -> Numpy:
    """The namespace a session's gradients live in (numpy unless the session says otherwise)."""
    return getattr(session, "array_ops", None) or numpy_ops()


def flatten(arrays_) -> "numpy.ndarray":
    """numpy: one float32 vector of the arrays' values, in order."""
    return numpy_ops().flatten(arrays_)


def unflatten(flat, like) -> list:
    """numpy: `flat` cut back into arrays shaped (and typed) like `like`."""
    return numpy_ops().unflatten(flat, like)
