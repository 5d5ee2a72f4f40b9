"""Gluon's deferred shapes for the MXNet session (adapters/mxnet/session.py): a model whose layers
leave their input sizes to Gluon (Conv2D(16, 3), Dense(10): deferred initialisation) is set up in
two halves. setup() places it and makes the Trainer (which takes deferred parameters); the model's
first forward pass, on every rank, finishes the rest once the shapes are known (this rank's digest,
the exchange's sizes, rank 0's parameters and optimizer state on every rank: the moment Horovod's
broadcast_parameters picks for them too). A resume before that pass takes the shapes from rank 0's
checkpoint (the strategy's broadcast).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import toolkit.shims.toolkit_numpy_compat  # noqa: F401  numpy.bool for MXNet on numpy 1.26, before `import mxnet`

# isort: split
import mxnet as mx
from mxnet import autograd, gluon

from toolkit.adapters.topology import digest
from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.adapters.mxnet.strategies.common import MxnetStrategy


class DeferredShapes:
    _first_call: Any = None     # the forward pre-hook that finishes setup, while the model's shapes are unknown

    if TYPE_CHECKING:           # what the MXNet session it is mixed into (adapters/mxnet/session.py) has
        params: Any
        strategy: MxnetStrategy
        local_digests: list[str]
        communication: Any

        @property
        def ctx(self) -> Any: ...
        def broadcast(self, root: int = 0) -> None: ...
        def replica_parameters(self) -> list[list]: ...

    @property
    def shapes_known(self) -> bool:
        return self._first_call is None

    def parameter_shapes(self) -> list | None:
        """Every parameter's shape, in the model's order, once all are known on this rank, else None."""
        if any(p._data is None for p in self.params.values()):
            return None
        return [p.shape for p in self.params.values()]

    def _finish_setup(self, model, inputs) -> None:
        """The model's first forward pass (a forward pre-hook), on every rank: the shapes from this
        batch and the parameters initialised, then setup's second half, before that pass uses them.
        A HybridBlock's shapes come from Gluon's inference on its graph (nothing computed); a plain
        Block's from running it once in predict mode (no statistics move), after which its
        parameters are made afresh: on the CPU, oneDNN keeps a convolution's weight in its own
        layout after an inference pass, which Horovod's broadcast cannot read ("We can't generate
        TBlob for MKLDNN data")."""
        with autograd.pause():
            if isinstance(model, gluon.HybridBlock):
                model.infer_shape(*inputs)
                for p in self.params.values():
                    p._finish_deferred_init()
            else:
                model.forward(*inputs)
                for p in self.params.values():
                    p._init_impl(mx.nd.array(p.data(self.ctx).asnumpy(), dtype=p.dtype), p.list_ctx())
            self._shapes_known()
            self.broadcast()

    def take_shapes(self, shapes: list) -> None:
        """The shapes rank 0 knows (from a checkpoint loaded before the first forward pass): the
        parameters this rank still defers made with them (zeros, no random draw; their values come
        by the broadcast that follows), then setup's second half."""
        for p, shape in zip(self.params.values(), shapes, strict=True):
            if p._data is None:
                p._load_init(mx.nd.zeros(shape, dtype=p.dtype), None)
        self._shapes_known()

    def _shapes_known(self) -> None:
        """What setup() could not do without the shapes: this rank's initial digest, and the
        communication, sized by the gradients it moves (no step has run: it holds no state yet)."""
        self._first_call.detach()
        self._first_call = None
        self.local_digests = [digest(p) for p in self.replica_parameters()]
        self.communication = self.strategy.communication(self)

    def train_step(self, batches):
        """The facade's step; a model whose shapes Gluon defers takes them from the step's first
        micro-batch before the step's communication starts (the first forward pass would otherwise
        run inside it, after it counted the step's bytes)."""
        if not self.shapes_known:
            self._finish_setup(self.model, (batches[0][0],))
        return super().train_step(batches)

    def _unknown_shapes(self, what: str) -> ToolkitError:
        return ToolkitError(f"{what}: the model's shapes are not known yet (Gluon's deferred initialisation, before "
                            "its first forward pass); run a step first, or give the layers in_units/in_channels")
