"""What a TensorFlow strategy answers beyond adapters/strategy.py, for the TensorFlow sessions
(adapters/tensorflow/session.py, native.py): the verbs the Keras step graph calls (`reduce_gradients`,
`average_loss`), the custom step of TensorFlow's own strategies (`train_step`), and `model.fit`'s
pieces (`fit_optimizer`, `fit_callbacks`). Each refuses in one line where a backend has none.
"""
from __future__ import annotations

from toolkit.adapters.strategy import Strategy


class TensorflowStrategy(Strategy):
    def reduce_gradients(self, grads) -> list:
        """Inside the session's step graph: the gradients reduced over the ranks."""
        raise self.refuse("a reduce inside the Keras step graph")

    def average_loss(self, loss):
        """Inside the session's step graph: the loss averaged over the ranks (nan_guard)."""
        raise self.refuse("a loss average inside the Keras step graph")

    def train_step(self, session, batches) -> float:
        """One optimizer step run by the strategy itself (TensorFlow's strategy.run)."""
        raise self.refuse("a step of its own")

    def discard(self, session) -> None:
        """Several models: the gradients a backward pass left this model for another's step, dropped."""
        session._pending = None

    def fit_optimizer(self, session, optimizer):
        """For `model.compile`: `optimizer` reducing its gradients as the config says."""
        raise self.refuse("model.fit optimizer")

    def fit_callbacks(self) -> list:
        """For `model.fit`: rank 0's weights at the start, metrics and statistics averaged at each epoch's end."""
        raise self.refuse("model.fit callbacks")
