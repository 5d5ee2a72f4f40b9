"""A strategy: how gradients and state move between the ranks, decided once for a session.

The session (adapters/base.py, the facade) does the tensor work of its framework; its strategy,
chosen by the registry from (framework, backend), answers everything that crosses ranks. This class
declares every verb the facade, the sessions and the exchange call on a strategy (a default where a
backend has nothing to do); a framework's strategies add that framework's own verbs in one base
class each (torch: strategies/common.py `TorchStrategy`; TensorFlow: strategies/common.py
`TensorflowStrategy`; MXNet: strategies/common.py `MxnetStrategy`).

    start       init the ranks' group, pick this rank's device -> Topology (restarted, refresh)
    wrap        the optimizer wrapped for the strategy's reduce (or left local for the toolkit's exchange)
    broadcast   rank `root`'s model and optimizer state to every rank
    the step    sync_gradients (accumulation) -> reduce_loss -> reduce -> (precision, clip) -> reduced:
                the facade calls each at its place in the step's order (adapters/base.py `_reduce_and_apply`)
    communication  the object that counts and, for the toolkit's exchange, moves a step's gradients
    collectives allreduce / allgather / alltoall of arrays (over every rank, or a `new_group`'s),
                broadcast_object / allgather_object, join, elastic (elastic_run, elastic_rank, on_reset)

Which path moves a step's gradients (the backend's own reduce, or the toolkit's exchange:
compression, PowerSGD, DGC, local SGD, over the backend's collectives) is decided here, once
(`exchange`), and nowhere else. What a strategy cannot do it refuses in one line (`refuse`).
Adding a backend is one strategy module and one registry row (toolkit/registry.py).
"""
from __future__ import annotations

import abc
import contextlib
from typing import TYPE_CHECKING

from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.config import Config


class Strategy(abc.ABC):
    name: str = ""          # the backend: "horovod", "native", ...
    path: str = ""          # how it trains, in a few words (the JSON summary's "path")
    collectives: str = ""   # whose collectives the toolkit's exchange runs on, when not Horovod's
    groups: bool = False    # whether `new_group` makes groups of ranks (the hierarchical exchange)

    def __init__(self, config: Config) -> None:
        self.config = config
        # The toolkit's exchange (toolkit/exchange/communication.py) moves the gradients over this strategy's
        # collectives; else the backend reduces them itself (Horovod's distributed optimizer, ...).
        self.exchange: bool = config.toolkit_exchange

    def reconfigure(self, config: Config) -> None:
        """compression: auto, resolved at the first setup (toolkit/planner/auto.py): what the strategy decides from
        the config, decided again from the config it chose (before anything is wrapped)."""
        self.config = config
        self.exchange = config.toolkit_exchange

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

    def check_another_model(self) -> None:
        """A second model in one session trains on the backend's own reduce only: refused in one line
        where the toolkit's exchange or elastic training would move it."""
        c = self.config
        if c.toolkit_exchange or c.elastic:
            what = "elastic: true" if c.elastic else f"compression={c.compression.value}, sync={c.sync.value}"
            raise ToolkitError(f"session.setup() of a second model with {what}: several models train on Horovod's "
                               "own reduce only (compression none/fp16, sync every_step, elastic false)")

    def communication(self, session):
        """The object that counts and (for the exchange) moves a step's gradients: toolkit/exchange/communication.py."""
        from toolkit.exchange import communication
        return communication.for_session(self.config, session, exchange=self.exchange)

    def discard(self, session) -> None:
        """Several models: the active one's gradients from a backward pass meant for another model
        are dropped when that one steps (reductions already under way finished first). Nothing to
        drop where the framework keeps no gradients between steps."""

    def scope(self):
        """Where a model must be created (TensorFlow's strategy scope); elsewhere nothing."""
        return contextlib.nullcontext()

    # -- the step, in the facade's order (adapters/base.py `_reduce_and_apply`) ---------------------------
    def sync_gradients(self, session, on: bool) -> None:
        """Accumulation: whether the coming micro-batch's backward pass reduces (the last one) or not;
        nothing to say where the reduce runs at the step (Horovod's hooks count the passes themselves)."""

    def reduce_loss(self, session, loss):
        """nan_guard: start averaging the step's loss over the ranks beside the gradients; a handle for
        `reduced_loss`, or None where there is nothing to average (one rank)."""
        return None

    def reduced_loss(self, session, pending, loss):
        """The loss averaged over the ranks (the handle `reduce_loss` gave), or `loss` itself."""
        return loss

    def reduce(self, session) -> None:
        """The step's gradients reduced over the ranks (nothing where the backward pass reduced them)."""

    def reduced(self, session):
        """A context for the optimizer's update after `reduce`, so it does not reduce a second time."""
        return contextlib.nullcontext()

    # -- collectives ---------------------------------------------------------------------------------------
    # `group`: a handle `new_group` made (the collective runs among its ranks only), None for every rank.
    @abc.abstractmethod
    def allreduce(self, array, average: bool = True, name: str | None = None, group=None):
        """numpy array (or a tensor of the framework) in, the same kind out, summed or averaged over ranks."""

    @abc.abstractmethod
    def allgather(self, array, group=None):
        """1-D array in (any length per rank), the ranks' arrays concatenated in rank order out."""

    def alltoall(self, array, splits: list[int], group=None):
        """1-D array in, cut in len(splits) parts (part j, splits[j] values, goes to rank j); the parts the
        ranks sent this rank out, concatenated in rank order."""
        raise self.refuse("alltoall (the compressed allreduce of bf16 and int8)")

    def new_group(self, ranks: list[int]):
        """A handle for collectives among `ranks` only (the hierarchical exchange's groups: the ranks of one
        host, the ranks of one local rank across hosts). Collective: every rank calls it for every group,
        in the same order, member or not."""
        raise self.refuse("groups of ranks (the hierarchical exchange)")

    def drop_groups(self) -> None:
        """The groups `new_group` made, given back (compression: auto timed a hierarchical exchange it did not
        choose). Collective. Nothing to give back where groups cost nothing between collectives."""

    @abc.abstractmethod
    def allgather_object(self, obj, name: str) -> list: ...

    @abc.abstractmethod
    def broadcast_object(self, obj, name: str, root: int = 0): ...

    def join(self) -> int:
        raise self.refuse("join")

    def elastic_run(self, func):
        raise self.refuse("elastic training")

    def elastic_rank(self) -> int:
        """This worker's rank now (elastic training renumbers the ranks as workers leave or join)."""
        raise self.refuse("elastic training")

    def on_reset(self, session) -> None:
        """After the job was re-formed with other workers (elastic)."""

    def refuse(self, what: str) -> ToolkitError:
        other = "native" if self.name == "horovod" else "horovod"
        return ToolkitError(f"backend={self.name} ({self.config.framework}) has no {what}; use backend: {other} "
                            "for it, or leave out what asks for it (`toolkit doctor` and docs/CONFIG.md list what "
                            "each backend runs)")
