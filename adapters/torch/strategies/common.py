"""What every torch strategy answers the same way unless it wraps or shards the model (adapters/torch/strategies/:
horovod.py keeps the user's module as it is; native.py wraps it in DDP or shards it with FSDP2 / ZeRO).

The torch session (adapters/torch/session.py) asks its strategy for the user's own module behind a
wrapper (`unwrap`), for the model's and optimizer's whole state as plain state dicts (`full_state`,
a collective where the state is sharded: every rank calls it) and gives a saved one back
(`stash_loaded`, on the rank that read the checkpoint, before the strategy's `broadcast`); and the
BatchNorm layers that average their statistics over every rank (`sync_batchnorm`). The verbs every
framework's strategy shares are adapters/strategy.py's.
"""
from __future__ import annotations

from typing import Any

from toolkit.adapters.strategy import Strategy


class TorchStrategy(Strategy):
    device: Any = None      # torch.device of this rank, set by start()

    @property
    def wraps_module(self) -> bool:
        """Whether wrap() puts the model inside a wrapper (DDP, FSDP2)."""
        return False

    def unwrap(self, model):
        """The user's module (its state_dict has the user's names): a compiled model's original module."""
        return plain(model)

    def full_state(self, part) -> dict:
        """{"model": state_dict, "optimizer": state_dict} of one part, plain tensors: the checkpoint's format."""
        return {"model": self.unwrap(part.model).state_dict(), "optimizer": part.optimizer.state_dict()}

    def sync_batchnorm(self, model):
        """The model with every BatchNorm averaging its statistics over every rank's batch."""
        raise self.refuse("sync_batchnorm")

    def stash_loaded(self, part, state: dict) -> None:
        """A checkpoint's part state, on the rank that read it: loaded here (the broadcast shares it)."""
        self.unwrap(part.model).load_state_dict(state["model"])
        part.optimizer.load_state_dict(state["optimizer"])


def plain(model):
    """The module inside torch.compile's and DDP's wrappers (either order, each at most once)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = getattr(model, "_orig_mod", model)
    model = model.module if isinstance(model, DDP) else model
    return getattr(model, "_orig_mod", model)
