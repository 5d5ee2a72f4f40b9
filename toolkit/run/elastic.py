"""Elastic training: the trainer's progress and the session's model in one Horovod elastic State.

Horovod elastic (`horovodrun --min-np/--host-discovery-script`, Gloo) restarts the training
function when a worker fails or hosts change: on a failure every survivor rolls back to the last
`commit()` (`restore`), Horovod re-forms the ring with the workers left, and rank 0's copy is
broadcast to all, new workers included (`sync`). This State is written once for every framework:
the model and optimizer come through the session (`snapshot` / `restore` / `broadcast`), the
progress (epoch, position in the epoch, step, ...) as plain Python values, as Horovod's ObjectState
does. Imported only by the trainer, inside a rank, when `elastic_*` is configured.
"""
from __future__ import annotations

from horovod.common.elastic import ObjectState


class TrainingState(ObjectState):
    def __init__(self, session, **progress):
        self._session = session
        self._snapshot = session.snapshot()
        super().__init__(bcast_object=lambda obj: session.broadcast_object(obj, name="toolkit.elastic_state"),
                         get_rank=session.strategy.elastic_rank, **progress)
        self.register_reset_callbacks([session.on_reset])

    def save(self) -> None:
        self._snapshot = self._session.snapshot()
        super().save()

    def restore(self) -> None:
        self._session.restore(self._snapshot)
        super().restore()

    def sync(self) -> None:
        self._session.broadcast()       # rank 0's model and optimizer on every worker, new ones too
        super().sync()


def run(session, train, **progress):
    """train(state) under the framework's `hvd.elastic.run`; returns the final state."""
    state = TrainingState(session, **progress)
    session.elastic_run(train)(state)
    return state
