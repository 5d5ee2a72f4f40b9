"""A strategy: how gradients and state move between the ranks, decided once for a session.

The session (adapters/base.py, the facade) does the tensor work of its framework; its strategy,
chosen by the registry from (framework, backend), answers everything that crosses ranks:

    start       init the ranks' group, pick this rank's device -> Topology
    wrap        the optimizer wrapped for the strategy's reduce (or left local for the toolkit's exchange)
    broadcast   rank `root`'s model and optimizer state to every rank
    reduce      the step's gradients reduced (the facade calls it at its place in the step's order)
    collectives allreduce / allgather of arrays, broadcast_object / allgather_object, join, elastic

Which path moves a step's gradients (the backend's own reduce, or the toolkit's exchange:
compression, PowerSGD, DGC, local SGD, over the backend's collectives) is decided here, once
(`exchange`), and nowhere else. What a strategy cannot do it refuses in one line (`refuse`).
Adding a backend is one strategy module and one registry row (toolkit/registry.py).
"""
from __future__ import annotations

import abc

from toolkit.errors import ToolkitError


class Strategy(abc.ABC):
    name: str = ""          # the backend: "horovod", "native", ...
    path: str = ""          # how it trains, in a few words (the JSON summary's "path")
    collectives: str = ""   # whose collectives the toolkit's exchange runs on, when not Horovod's

    def __init__(self, config):
        self.config = config
        # The toolkit's exchange (toolkit/exchange/communication.py) moves the gradients over this strategy's
        # collectives; else the backend reduces them itself (Horovod's distributed optimizer, ...).
        self.exchange: bool = config.toolkit_exchange

    # -- start --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def start(self, comm=None):
        """Init (on the mpi4py communicator `comm` where the backend takes one), threads, this rank's
        device; returns the Topology."""

    def restarted(self) -> bool:
        """Whether the launcher started these ranks again after a failure (torchrun's elastic restarts):
        the run then continues from its newest checkpoint, as `resume` would."""
        return False

    def refresh(self, topology):
        """The topology after the job was re-formed (elastic); unchanged where it cannot change."""
        return topology

    # -- the user's objects ----------------------------------------------------------------------------
    @abc.abstractmethod
    def wrap(self, session) -> None:
        """session.optimizer wrapped for this strategy's reduce (unchanged when the exchange reduces)."""

    @abc.abstractmethod
    def broadcast(self, session, root: int = 0) -> None:
        """Model (parameters and buffers) and optimizer state from rank `root` to every rank."""

    def communication(self, session):
        """The object that counts and (for the exchange) moves a step's gradients: toolkit/exchange/communication.py."""
        from toolkit.exchange import communication
        return communication.for_session(self.config, session, exchange=self.exchange)

    def discard(self, session) -> None:
        """Several models: the active one's gradients from a backward pass meant for another model
        are dropped when that one steps (reductions already under way finished first). Nothing to
        drop where the framework keeps no gradients between steps."""

    # -- collectives ---------------------------------------------------------------------------------------
    @abc.abstractmethod
    def allreduce(self, array, average: bool = True, name: str | None = None):
        """numpy array (or a tensor of the framework) in, the same kind out, summed or averaged over ranks."""

    @abc.abstractmethod
    def allgather(self, array):
        """1-D array in (any length per rank), the ranks' arrays concatenated in rank order out."""

    def alltoall(self, array, splits: list[int]):
        """1-D array in, cut in len(splits) parts (part j, splits[j] values, goes to rank j); the parts the
        ranks sent this rank out, concatenated in rank order."""
        raise self.refuse("alltoall (the compressed allreduce of bf16 and int8)")

    @abc.abstractmethod
    def allgather_object(self, obj, name: str) -> list: ...

    @abc.abstractmethod
    def broadcast_object(self, obj, name: str, root: int = 0): ...

    def join(self) -> int:
        raise self.refuse("join")

    def elastic_run(self, func):
        raise self.refuse("elastic training")

    def on_reset(self, session) -> None:
        """After the job was re-formed with other workers (elastic)."""

    def refuse(self, what: str) -> ToolkitError:
        return ToolkitError(f"backend={self.name} ({self.config.framework}) has no {what}; see toolkit/registry.py")
