"""What one rank sends over the links for a collective, and what that costs, under the algorithms the planner
assumes; and which form the compressed exchange runs at N workers (`exchange_form`), priced by the same model.

`bytes_sent_per_step` counts the payload a rank hands to collectives; `wire_bytes_per_step` what
crosses the links for it, per collective kind (`nbytes`: what this rank handed over):

- allreduce (ring): 2(N-1)/N of the buffer: a reduce-scatter and an allgather of N chunks.
- allgather (ring): N-1 payloads: every other rank's payload passes through this rank once (taken as
  N-1 copies of this rank's own, as the ranks' payloads are the same size or close to it).
- alltoall (pairwise): (N-1)/N of the buffer: every part but the one a rank keeps for itself.
- reducescatter (ring, FSDP's gradients): (N-1)/N of the buffer.

What it costs: a message of b bytes over a link costs alpha + b / bandwidth (Hockney 1994), and each
collective a fixed overhead besides (Horovod's negotiation and the wait for its next cycle: about a
millisecond here, the planner's calibration fit finds it). The collectives are the ring algorithms
that NCCL, Gloo and Open MPI use for large messages (Patarasuk & Yuan 2009; Thakur, Rabenseifner &
Gropp 2005):
- allreduce of S bytes: 2(N-1) steps of S/N bytes: 2(N-1) alpha + 2(N-1)/N S / bandwidth;
- allgather of s bytes from each rank: N-1 steps of s bytes: (N-1) alpha + (N-1) s / bandwidth;
- broadcast of S bytes (a binomial tree): ceil(log2 N) (alpha + S / bandwidth).

The planner's cost model (toolkit/planner/scaling.py) prices a step with these; the running exchange
(toolkit/exchange/exchanges.py) asks `exchange_form` which form to run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("allreduce", "allgather", "alltoall", "reducescatter")
HOROVOD_CYCLE_S = 1e-3      # Horovod 0.28.1's cycle time (horovod/common/operations.cc)


def messages(kind: str, n: int) -> int:
    """Messages one rank sends in sequence (each pays the link's latency)."""
    if n <= 1:
        return 0
    return {"allreduce": 2 * (n - 1), "allgather": n - 1, "alltoall": n - 1, "reducescatter": n - 1}[kind]


def sent(kind: str, nbytes: float, n: int) -> float:
    """Bytes one of `n` ranks sends over the links for a collective it handed `nbytes`."""
    if n <= 1:
        return 0.0
    return {"allreduce": 2 * (n - 1) / n * nbytes, "allgather": (n - 1) * nbytes,
            "alltoall": (n - 1) / n * nbytes, "reducescatter": (n - 1) / n * nbytes}[kind]


# -- what a collective costs ------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    alpha: float          # seconds per message (latency and per-message software cost)
    bandwidth: float      # bytes per second
    overhead: float = 0.0     # seconds per collective, whatever its size and N (Horovod's negotiation, its cycle)

    def cost(self, messages: float, nbytes: float) -> float:
        """One collective of `messages` sequential messages moving `nbytes` through the link."""
        return self.overhead + messages * self.alpha + nbytes / self.bandwidth


def ring_allreduce(size: float, n: int, link: Link) -> float:
    return 0.0 if n <= 1 else link.cost(2 * (n - 1), 2 * (n - 1) / n * size)


def ring_allgather(size_per_rank: float, n: int, link: Link) -> float:
    return 0.0 if n <= 1 else link.cost(n - 1, (n - 1) * size_per_rank)


def pairwise_alltoall(size: float, n: int, link: Link) -> float:
    """An alltoall of a buffer of `size` bytes per rank, N parts: N-1 messages of size/N each."""
    return 0.0 if n <= 1 else link.cost(n - 1, (n - 1) / n * size)


def tree_broadcast(size: float, n: int, link: Link) -> float:
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    return 0.0 if n <= 1 else link.cost(rounds, rounds * size)


# -- the compressed exchange's form -------------------------------------------------------------------

def exchange_work(reduced: bool, n: int, compress_s: float, decode_s: float) -> float:
    """The exchange's compression work at N workers (`compress_s`, `decode_s`: one whole payload's):
    the allgather compresses once and decodes N payloads; the compressed allreduce compresses once,
    decodes N chunks of 1/N, compresses its reduced chunk (1/N) and decodes the gathered whole."""
    return compress_s * (1 + 1 / n) + 2 * decode_s if reduced else compress_s + n * decode_s


# What the running exchange assumes when it chooses its form (it does not know the link): 10 Gbit/s, 10 us a
# message, Horovod's cycle a collective, and compression work at 1 GB/s of payload for either pass.
RUNTIME_LINK = Link(alpha=1e-5, bandwidth=10e9 / 8, overhead=HOROVOD_CYCLE_S)
RUNTIME_WORK_S_PER_BYTE = 1e-9


def exchange_form(n: int, payload: float, link: Link = RUNTIME_LINK, compress_s: float | None = None,
                  decode_s: float | None = None) -> str:
    """bf16 and int8 at N workers, `payload` compressed bytes a rank: "reduce" (the compressed allreduce:
    alltoall of N chunks, reduce, allgather of the reduced chunks; 2(N-1)/N of the payload on the wire),
    the default from 3 workers on, or "allgather" (every rank's whole payload to every rank: N-1
    payloads), kept at 2 workers where the model prices it lower: there both send the same bytes and
    the allgather needs one collective and half a compression less, so it wins on any link."""
    if n >= 3:
        return "reduce"
    compress_s = payload * RUNTIME_WORK_S_PER_BYTE if compress_s is None else compress_s
    decode_s = payload * RUNTIME_WORK_S_PER_BYTE if decode_s is None else decode_s
    gathered = ring_allgather(payload, n, link) + exchange_work(False, n, compress_s, decode_s)
    reduced = (pairwise_alltoall(payload, n, link) + ring_allgather(payload / n, n, link)
               + exchange_work(True, n, compress_s, decode_s))
    return "reduce" if reduced < gathered else "allgather"
