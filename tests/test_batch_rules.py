"""adapters/batches.py, the rule for a micro-batch's loss in the built-in step and in evaluate(), on stand-ins for
a session (no framework): (x, y) pairs, any other structure through the framework's model call, the user's loss
given the whole batch, the model's own loss, and the one-line refusals."""
import types

import pytest

from toolkit.adapters import batches
from toolkit.adapters.base import Session
from toolkit.errors import ToolkitError


def _session(loss_given, outputs=None):
    seen = []

    def model(x):
        seen.append(("model", x))
        return "logits"

    def call_model(batch):
        seen.append(("call", batch))
        return outputs

    me = types.SimpleNamespace(model=model, call_model=call_model, part=types.SimpleNamespace(loss_given=loss_given),
                               loss_fn=lambda out, target: ("loss", out, target))
    return me, seen


def test_a_pair_is_x_and_y_and_anything_else_goes_to_the_model_whole():
    me, seen = _session(loss_given=False)
    assert batches.loss_of(me, ("x", "y")) == ("loss", "logits", "y") and seen == [("model", "x")]
    me, seen = _session(loss_given=True, outputs="out")
    assert batches.loss_of(me, ("x", "y", "w")) == ("loss", "out", ("x", "y", "w"))   # the user's loss: the batch
    assert seen == [("call", ("x", "y", "w"))]
    me, _ = _session(loss_given=False, outputs={"loss": 0.25, "logits": None})
    assert batches.loss_of(me, {"input_ids": 1, "labels": 2}) == 0.25                 # the model's own loss
    me, _ = _session(loss_given=False, outputs=types.SimpleNamespace(loss=0.5))
    assert batches.loss_of(me, {"input_ids": 1}) == 0.5


def test_no_loss_for_a_batch_that_is_not_x_y_is_one_line():
    me, _ = _session(loss_given=False, outputs={"logits": 1})
    with pytest.raises(ToolkitError, match=r"dicts \(keys input_ids\), not \(x, y\).*no `loss`.*loss\(outputs, "
                                           r"batch\)"):
        batches.loss_of(me, {"input_ids": 1})


@pytest.mark.parametrize("framework", ["tensorflow", "mxnet"])
def test_train_step_on_batches_that_are_not_pairs_is_one_line_where_the_framework_takes_pairs(framework):
    me = types.SimpleNamespace(any_batch=False, config=types.SimpleNamespace(framework=framework))
    with pytest.raises(ToolkitError, match=rf"{framework} takes \(x, y\) micro-batches, these are 3-tuples; write "
                                           r"the step with session.backward"):
        Session.train_step(me, [("x", "y"), ("x", "y", "w")])
