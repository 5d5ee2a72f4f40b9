"""One micro-batch's loss in the built-in step (`session.train_step`) and in `session.evaluate()`, for a batch of
any structure the loaders carry:

- `(x, y)`: `loss(model(x), y)`, the loss given to setup() or cross-entropy on logits;
- anything else (a dict, a triple such as `(x, y, weight)`, one tensor): the model called on it the framework's way
  (torch: a dict's keys as keyword arguments, `model(**batch)`, as Hugging Face models take them; Keras 3: a dict
  whole, keyed by the model's inputs; MXNet: a dict whole, as one argument; every framework: a tuple's first
  field, one tensor as it is), then `loss(outputs, batch)` where setup() was given a loss, else the model's own
  loss (an output named `loss`, as a Hugging Face model returns when the batch holds labels).

Framework-free: the session supplies the model call (`call_model`).
"""
from __future__ import annotations

from collections.abc import Mapping

from toolkit.errors import ToolkitError


def is_pair(batch) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2


def loss_of(session, batch):
    """The setup loss of one micro-batch (a framework tensor; mean over its samples)."""
    if is_pair(batch):
        x, y = batch
        return session.loss_fn(session.model(x), y)
    outputs = session.call_model(batch)
    if session.part.loss_given:
        return session.loss_fn(outputs, batch)
    own = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if own is None:
        raise ToolkitError(f"the batches are {describe(batch)}, not (x, y), and the model's outputs hold no `loss`: "
                           "give setup() a loss(outputs, batch) (the built-in script: a `loss` function beside "
                           "build), or return a loss from the model (a Hugging Face model does when the batch "
                           "has `labels`)")
    return own


def describe(batch) -> str:
    if isinstance(batch, Mapping):
        return f"dicts (keys {', '.join(map(str, batch))})"
    if isinstance(batch, (tuple, list)):
        return f"{len(batch)}-tuples"
    return type(batch).__name__


def token_length(batch) -> int | None:
    """The length of one sample's inputs where they are token ids, a [batch, T] tensor of integers (any
    framework's: torch's, TensorFlow's, MXNet's or numpy's dtype names), else None."""
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    shape, dtype = getattr(inputs, "shape", None), getattr(inputs, "dtype", None)
    if shape is None or len(shape) != 2:
        return None
    return int(shape[1]) if "int" in str(getattr(dtype, "name", dtype)) else None
