"""The hierarchical exchange: full precision inside a host, compressed only across hosts.

A link between hosts is several times slower than the links inside one, so compression pays there and
only there (ZeRO++'s qgZ makes the same split). With K ranks on each of H hosts (ranks host by host, as
horovodrun, mpirun and torchrun number them), one step is:

1. **Inside the host, a float32 reduce-scatter**: the flat gradient is cut into K shards (whole
   compression blocks, `GradientExchange.chunks`); an alltoall among the host's ranks gives local rank k
   every local rank's shard k, which it sums in local-rank order.
2. **Across hosts, the compressed exchange of that shard**: only ranks with the same local rank take
   part (H of them); they run the ordinary exchange (toolkit/exchange/exchanges.py: error feedback,
   the compressed allreduce or the allgather, whichever the model prices cheaper at H) on 1/K of the
   gradient. A host sends the compressed gradient across once, not K times; with compression none
   the shard crosses at float32 (the uncompressed baseline of this form).
3. **Inside the host, an allgather** of the reduced shards: every rank holds the whole mean.

Every rank ends with the same bits: the shards are summed in a fixed order, the exchange across hosts is
bit-identical on its ranks (exchanges.py), and the allgather copies. Error feedback keeps each rank's
residual of its own shard (saved as a whole-gradient row, zero outside the shard, so checkpoints keep the
flat form's shape).

The groups (`Strategy.new_group`: Horovod process sets, torch.distributed groups) are made once, from
every rank's (local rank, local size); `place` says why there is no hierarchy where there is none.

Unset, `hierarchical_exchange` is on for bf16 and int8 where the job has several hosts of several ranks, on GPUs
and on torch's native backend. Horovod on a CPU runs it only when asked (`true`), as Horovod's own hierarchical
allreduce is opt-in: its background loop negotiates every process set each cycle, and each of the form's four
collectives waits for its set's ranks. Measured on 2 x 2 namespace hosts sharing 2 cores at 1 Gbit/s, int8
hierarchical took 1.4-2.3x none's step where int8 flat took 0.7-0.8x (docs/COMMUNICATION.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.config import Op
from toolkit.errors import ToolkitError
from toolkit.exchange.exchanges import GradientExchange, make_exchange


@dataclass(frozen=True)
class Levels:
    """This rank's place in the two levels and the groups' handles."""
    local_rank: int
    ranks_per_host: int     # K
    host: int
    hosts: int              # H
    local: Any              # the group of this host's K ranks
    cross: Any              # the group of the H ranks with this local rank

    @property
    def world(self) -> int:
        return self.ranks_per_host * self.hosts


def place(places: list[tuple[int, int]]) -> tuple[int, int] | str:
    """(ranks per host K, hosts H) from every rank's (local_rank, local_size), in rank order, or why
    the ranks do not form equal hosts numbered host by host."""
    sizes = {size for _, size in places}
    if len(sizes) != 1:
        return f"hosts with different numbers of ranks ({sorted(sizes)})"
    k = sizes.pop()
    if len(places) % k or any(local != r % k for r, (local, _) in enumerate(places)):
        return "ranks not numbered host by host (local rank = rank mod ranks per host)"
    return k, len(places) // k


def levels(session, shape: tuple[int, int]) -> Levels:
    """The groups of a K x H job (`place`): every rank makes every group, in the same order (the
    collectives' rule), and keeps its own two."""
    k, h = shape
    rank = session.rank
    local = cross = None
    for host in range(h):                   # every host's ranks
        group = session.strategy.new_group([host * k + j for j in range(k)]) if k > 1 else None
        if host == rank // k:
            local = group
    for j in range(k):                      # every local rank's ranks across the hosts
        group = session.strategy.new_group([host * k + j for host in range(h)]) if h > 1 else None
        if j == rank % k:
            cross = group
    return Levels(rank % k, k, rank // k, h, local, cross)


def make(config, session, ops, values: int) -> HierarchicalExchange | None:
    """The hierarchical exchange for this job, or None where the flat one runs: `hierarchical_exchange` unset
    (auto) and the job on one host, or one rank a host, or a strategy without groups. Collective."""
    asked = config.hierarchical_exchange is True
    if not session.strategy.groups:
        if asked:
            raise session.strategy.refuse("groups of ranks (hierarchical_exchange: true)")
        return None
    places = session.allgather_object((session.local_rank, session.local_size), name="toolkit.hierarchy")
    shape = place(places)
    if isinstance(shape, str):
        if asked:
            raise ToolkitError(f"hierarchical_exchange: true needs equal hosts numbered host by host, but this job has {shape}; "
                               "launch the same number of ranks on each host, or drop hierarchical_exchange")
        return None
    if not asked and 1 in shape:        # one host, or one rank a host: nothing to split
        return None
    if not asked and not unset_means_levels(session.strategy.name, on_gpu(session.device)):
        return None         # Horovod on a CPU: flat unless asked (the module's docstring)
    return HierarchicalExchange(summing(config, ops), levels(session, shape), config.op is not Op.SUM, values)


def unset_means_levels(backend: str, gpu: bool) -> bool:
    """Whether `hierarchical_exchange` unset runs the hierarchical form (on hosts of several ranks): on GPUs and on
    torch's native backend, not on Horovod on a CPU (the module's docstring)."""
    return gpu or backend != "horovod"


def on_gpu(device) -> bool:
    """Whether a session's device (as its framework names it: torch "cuda:0", TensorFlow "gpu:0", MXNet "gpu(1)";
    "cpu", "cpu(0)") is a GPU."""
    return not str(device).startswith("cpu")


def summing(config, ops) -> GradientExchange:
    """The exchange across hosts: it sums the shards (the mean over every rank is taken after)."""
    cross = make_exchange(config, ops)
    cross.average = False
    return cross


class Group:
    """The session's collectives among one group's ranks, as GradientExchange calls them."""

    def __init__(self, session, group, rank: int):
        self.session, self.group, self.rank = session, group, rank

    def allgather(self, array):
        return self.session.allgather(array, group=self.group)

    def alltoall(self, array, splits):
        return self.session.alltoall(array, splits, group=self.group)

    def allreduce(self, array, average: bool = True):
        return self.session.allreduce(array, average=average, group=self.group)


class HierarchicalExchange:
    """`cross` (a GradientExchange that sums, average=False) runs on each rank's shard across hosts;
    this class does the two steps inside the host around it. Communication reads the same attributes
    as from a GradientExchange (calls, timer, compressor, error_feedback, state)."""

    form = "hierarchical"

    def __init__(self, cross: GradientExchange, levels: Levels, average: bool, values: int):
        self.cross, self.levels, self.average, self.n = cross, levels, average, values
        self.ops = cross.ops
        self.calls: list = []
        self._input: Any = None     # exchange_flat's input buffer, from `buffer`
        # this rank's shard of the flat gradient (`values` long)
        self.span = cross.chunks(values, levels.ranks_per_host)[levels.local_rank]

    # what Communication reads, the cross exchange's
    @property
    def compressor(self):
        return self.cross.compressor

    @property
    def error_feedback(self) -> bool:
        return self.cross.error_feedback

    @property
    def timer(self):
        return self.cross.timer

    @property
    def cross_form(self) -> str:
        """How the shards cross the hosts: "allreduce" (float32), "reduce" or "allgather" (compressed)."""
        if self.cross.compressor.name == "none":
            return "allreduce"
        return self.cross.form or "allgather"

    @property
    def shard_values(self) -> int:
        """The values of this rank's shard (what it exchanges across hosts)."""
        return self.span[1] - self.span[0]

    def choose_form(self, n: int, world_size: int) -> None:
        """The form across hosts for the shard of a gradient of n values (toolkit/exchange/buckets.py)."""
        a, e = self.cross.chunks(n, self.levels.ranks_per_host)[self.levels.local_rank]
        self.cross.choose_form(e - a, self.levels.hosts)

    def buffer(self, n: int):
        """A flat buffer of n values for exchange_flat's input (kept by this exchange, never by its result)."""
        if self._input is None or len(self._input) != n:
            self._input = self.ops.empty(n)
        return self._input

    def exchange(self, grads, session, world_size: int) -> list:
        return self.ops.unflatten(self.exchange_flat(self.ops.flatten(grads), session, world_size), grads)

    def exchange_flat(self, flat, session, world_size: int):
        lv = self.levels
        n = len(flat)
        chunks = self.cross.chunks(n, lv.ranks_per_host)
        a, e = chunks[lv.local_rank]
        shard = self.cross.buffer(e - a)          # the cross exchange owns it (its next residual)
        local = Group(session, lv.local, lv.local_rank)
        if lv.ranks_per_host > 1:
            splits = [end - start for start, end in chunks]
            received = local.alltoall(flat, splits)
            m = e - a
            shard[:] = received[:m]
            for j in range(1, lv.ranks_per_host):
                shard += received[j * m:(j + 1) * m]
        else:
            shard[:] = flat
        inside = [("alltoall", 4 * n, lv.ranks_per_host, "host")] if lv.ranks_per_host > 1 else []
        reduced = self.cross.exchange_flat(shard, Group(session, lv.cross, lv.host), lv.hosts)
        across = [(kind, nbytes, lv.hosts, "cross") for kind, nbytes in self.cross.calls]
        if self.average:
            reduced = reduced / lv.world
        if lv.ranks_per_host > 1:
            whole = local.allgather(reduced)
            inside.append(("allgather", 4 * (e - a), lv.ranks_per_host, "host"))
        else:
            whole = reduced
        self.calls = inside + across
        return whole

    # -- checkpoints: this rank's residuals as whole-gradient rows (zero outside its shard) ----------------
    def state(self) -> dict:
        out = {}
        a, e = self.span
        for name, buf in self.cross.state().items():
            row = self.ops.zeros(self.n)
            row[a:e] = buf
            out[name] = row
        return out

    def load_state(self, state: dict) -> None:
        a, e = self.span
        self.cross.load_state({name: self.ops.cat([row[a:e]]) for name, row in state.items()})
