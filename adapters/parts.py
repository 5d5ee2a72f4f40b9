"""The models a session trains: one `Part` per `Session.setup()` call (several where the framework allows:
a GAN's generator and discriminator), each with its optimizer, loss and the object that moves its
gradients. The session's verbs act on one part at a time: the one being set up or stepped, else the
first (`on_part`: a session attribute that is that part's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkit.errors import ToolkitError


@dataclass(eq=False)        # a part is itself: compared (and found in lists) by identity
class Part:
    """One model a session trains, with its optimizer, loss and the object that moves its gradients.
    A session has one per setup() call (several where the framework allows: a GAN's generator and
    discriminator); the verbs act on the part being set up or stepped, else on the first."""
    model: Any = None
    optimizer: Any = None
    loss_fn: Any = None
    loss_given: bool = False        # setup() was given the loss (else cross-entropy, or the model's own loss)
    communication: Any = None       # toolkit.exchange.communication.Communication, made by setup()
    own: dict = field(default_factory=dict)     # what the framework's session keeps per model (part_own)


def on_part(name: str):
    """A session attribute that is the active part's (the session's `part`)."""
    return property(lambda self: getattr(self.part, name), lambda self, value: setattr(self.part, name, value))


def part_own(name: str):
    """A session attribute the framework's session keeps per model, in the active part's `own` (MXNet: the
    model's ParameterDict; TensorFlow: its graph functions and the gradients a backward pass left it)."""
    return property(lambda self: self.part.own.get(name), lambda self, value: self.part.own.__setitem__(name, value))


def part_of(parts: list[Part], active: Part, optimizer) -> Part:
    """The part whose optimizer is `optimizer` (what setup() returned); None: the only one (`active`)."""
    if optimizer is None:
        if len(parts) > 1:
            raise ToolkitError(f"session.step(): this session has {len(parts)} optimizers; name the one "
                               "to step: session.step(optimizer)")
        return active
    for part in parts:
        if part.optimizer is optimizer:
            return part
    raise ToolkitError("session.step(optimizer): not an optimizer session.setup() returned; step the one "
                       "setup() gave back")
