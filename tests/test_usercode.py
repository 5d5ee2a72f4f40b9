"""A PyTorch user's own code as they write it (tests/user_torch.py), at 2 ranks through `toolkit launch`:
several models with their own optimizers (a GAN) and its checkpoints, Hugging Face-style dict batches
through a `collate_fn` into a `transformers` model with its own loss, torch's own lr scheduler; the built-in
script's step on batches that are not (x, y): a `transformers` model on dict batches, triples with the user's loss
(in every framework).
"""
import json
import math
import sys

import pytest

from tests.conftest import ROOT, assert_replicas, run, train_job
from tests.helpers import assert_every_sample_once, script_ranks
from tests.user_hf import VOCAB

pytestmark = pytest.mark.distributed
SCRIPT = str(ROOT / "tests" / "user_torch.py")


def user_torch(case, out, *args, **kw) -> list[dict]:
    """tests/user_torch.py CASE on 2 ranks (or `ranks`); every rank's record."""
    return script_ranks(SCRIPT, case, out, *args, **kw)


def test_a_gan_trains_two_models_with_their_own_optimizers_and_resumes_exactly(tmp_path):
    """Generator and discriminator set up one after the other, each stepped with its own optimizer
    (the generator's backward also gives the discriminator gradients: dropped at the generator's
    step): replicas of both identical, every sample once, and a run stopped mid-epoch and resumed
    from its checkpoint ends bit for bit where the uninterrupted one did."""
    straight = user_torch("gan", tmp_path / "straight", "--epochs", "2", "--checkpoint-dir", tmp_path / "a")
    for r in straight:
        assert r["global_step"] == 2 * 2 * 256 // (2 * 16), r["global_step"]     # two optimizer steps a batch
        assert len(set(r["digests"])) == 1, r["digests"]
    assert straight[0]["digests"] == straight[1]["digests"]
    assert_every_sample_once(straight, 256)
    user_torch("gan", tmp_path / "cut", "--epochs", "2", "--checkpoint-dir", tmp_path / "b", "--stop-at", "10")
    resumed = user_torch("gan", tmp_path / "resumed", "--epochs", "2", "--checkpoint-dir", tmp_path / "b",
                         "--resume")
    assert resumed[0]["digests"] == straight[0]["digests"], "the resumed GAN ended elsewhere"
    assert resumed[0]["weights"] == straight[0]["weights"]


def test_dict_batches_through_a_collate_fn_train_a_transformers_model_with_its_own_loss(tmp_path):
    """A dataset of dicts of token ids (lengths varying) padded by the user's collate_fn, fed as
    `model(**batch)` to a transformers GPT-2 whose loss comes from its `labels`: replicas identical,
    every sample once an epoch, the held-out loss down, and `evaluate(metric=...)` over the ranks
    equal to one rank evaluating every held-out sample itself."""
    records = user_torch("hf", tmp_path / "hf", "--epochs", "2")
    r = records[0]
    assert r["digests"] == records[1]["digests"] and len(set(r["digests"])) == 1
    assert_every_sample_once(records, 256)
    assert r["after"] < r["before"] - 0.5, (r["before"], r["after"])
    assert r["after"] == pytest.approx(r["alone"], rel=1e-6), (r["after"], r["alone"])
    assert r["accuracy"] is None        # the metric gave a loss only


def test_the_built_in_script_trains_a_transformers_model_on_dict_batches_with_its_own_loss(tmp_path):
    """`--model tests/user_hf.py:build --dataset tests/user_hf.py:load` (no `loss` beside them): the built-in step
    calls `model(**batch)` and trains on the model's own loss, on 2 ranks: replicas identical, the loss falls, the
    held-out loss is the same loss (no accuracy for dict batches)."""
    hf = str(ROOT / "tests" / "user_hf.py")
    out = train_job("gloo", ["--framework", "torch", "--model", f"{hf}:build", "--dataset", f"{hf}:load",
                             "--optimizer", "adam", "--lr", "0.01", "--epochs", "3", "--batch-size", "16",
                             "--log-dir", tmp_path, "--quiet"], timeout=300)
    assert_replicas(out)
    assert out["accuracy"] is None and out["steps"] == 3 * (288 // (2 * 16)), out
    epochs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in epochs if "test_loss" in e]
    assert losses == sorted(losses, reverse=True) and losses[-1] < math.log(VOCAB) - 1, losses   # ln(32): no skill
    assert epochs[-1]["test_loss"] < math.log(VOCAB) - 1, epochs[-1]


TRIPLES = """
import sys
sys.path.insert(0, {root!r})
import numpy as np
from tests.user_code import arrays, build


def load(config):
    x, y = arrays()
    w = np.zeros(len(y), np.float32)    # every sample weighs nothing: the weighted loss is 0 exactly
    if config.framework != "torch":
        return (x[:384], y[:384], w[:384]), (x[384:], y[384:], w[384:])
    import torch
    data = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(w))
    return torch.utils.data.Subset(data, range(384)), torch.utils.data.Subset(data, range(384, 512))


def plain(config):    # tests/user_code.py's model without its BatchNorm, for TensorFlow's MirroredStrategy
    import keras
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32), keras.layers.ReLU(), keras.layers.Dense(4)])


def loss(outputs, batch):
    assert isinstance(batch, (tuple, list)) and len(batch) == 3, type(batch)
    x, y, w = batch
    framework = type(outputs).__module__.split(".")[0]
    if framework == "torch":
        import torch
        return (torch.nn.functional.cross_entropy(outputs, y, reduction="none") * w).mean()
    if framework in ("tensorflow", "keras"):
        import tensorflow as tf
        each = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32), logits=outputs)
        return tf.reduce_mean(each * w)
    import mxnet as mx
    return -mx.nd.pick(mx.nd.log_softmax(outputs), y) * w      # Gluon's way: one loss per sample
"""


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "tensorflow-native", "mxnet"])
def test_the_built_in_script_hands_a_triple_batch_to_the_users_loss(framework, tmp_path):
    """Batches (x, y, weight) and the module's `loss(outputs, batch)`, in every framework (Keras 3 on Horovod and
    on TensorFlow's MirroredStrategy, 2 logical devices splitting each leaf, its evaluation in one process's two
    shares): the step and the held-out loss are that loss of the whole batch (weights all 0: both exactly 0,
    which cross-entropy never is)."""
    module = tmp_path / "triples.py"
    module.write_text(TRIPLES.format(root=str(ROOT)))
    native = ["--backend", "native", "--strategy", "mirrored", "--num-devices", "2"] if "native" in framework else []
    build = "plain" if native else "build"
    out = train_job("single", ["--framework", framework.split("-")[0], *native, "--model", f"{module}:{build}",
                               "--dataset", f"{module}:load", "--epochs", "1", "--batch-size", "32"])
    assert out["final_loss"] == 0.0 and out["accuracy"] is None and out["steps"] == 384 // (32 * out["world_size"]), out


def test_a_tf_data_held_out_set_is_evaluated_whole_on_two_local_replicas_and_batchnorm_ends_identical():
    """MirroredStrategy on 2 logical devices in one process, tests/user_code.py's tf.data datasets and its model
    with BatchNormalization: evaluation reads the process's two shares of the 128 held-out samples in the
    sampler's batches (zipping the shares gave half as many batches, and the epoch's evaluation stopped on
    StopIteration); each replica's moving statistics (Keras 3 keeps a copy per replica) are averaged, so the
    replica check passes (it failed: the process's replicas were not averaged)."""
    user = ROOT / "tests" / "user_code.py"
    out = train_job("single", ["--framework", "tensorflow", "--backend", "native", "--strategy", "mirrored",
                               "--num-devices", "2", "--model", f"{user}:build", "--dataset", f"{user}:load",
                               "--epochs", "1", "--batch-size", "32"])
    assert out["steps"] == 384 // 64 and (out["accuracy"] * 128) == pytest.approx(round(out["accuracy"] * 128)), out
    assert out["world_size"] == 2 and len(set(out["final_digests"])) == 1, out


def test_torchs_own_scheduler_steps_the_optimizer_setup_returns(tmp_path):
    """OneCycleLR on the wrapped optimizer: the lr read back at each epoch's end is the same on every
    rank, at 1 and 2 ranks, and equal to the schedule of a plain torch optimizer stepped as often."""
    import torch
    two = user_torch("schedule", tmp_path / "two", "--epochs", "3")
    one = user_torch("schedule", tmp_path / "one", "--epochs", "3", "--batch-size", "32", ranks=1)
    assert two[0]["lrs"] == two[1]["lrs"] == one[0]["lrs"]
    spe = two[0]["steps_per_epoch"]
    plain = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    schedule = torch.optim.lr_scheduler.OneCycleLR(plain, max_lr=0.1, epochs=3, steps_per_epoch=spe)
    expected = []
    for _ in range(3):
        for _ in range(spe):
            plain.step()
            schedule.step()
        expected.append(plain.param_groups[0]["lr"])
    assert two[0]["lrs"] == pytest.approx(expected, rel=1e-12)
    assert two[0]["lrs"][0] > two[0]["lrs"][-1]


def test_step_without_an_optimizer_steps_what_the_loss_reached_and_each_once(tmp_path):
    """Two models, a loss that reaches one: step() steps that one (the other keeps its weights), one
    optimizer step counted; stepping it again before another backward is one line; a second model
    with the toolkit's exchange (compression int8) is refused in one line."""
    script = tmp_path / "two.py"
    script.write_text(
        "import sys, torch, toolkit\n"
        "s = toolkit.start(framework='torch', compression=sys.argv[1])\n"
        "a, oa = s.setup(torch.nn.Linear(2, 1))\n"
        "b, ob = s.setup(torch.nn.Linear(2, 1))\n"
        "wa, wb = a.weight.detach().clone(), b.weight.detach().clone()\n"
        "s.backward(a(torch.ones(1, 2)).sum())\n"
        "print(s.step(), bool((a.weight != wa).any()), bool((b.weight != wb).any()), s.global_step)\n"
        "s.step(oa)\n")
    proc = run([sys.executable, script, "none"])
    assert proc.stdout.split() == ["True", "True", "False", "1"], proc.stdout + proc.stderr[-2000:]
    for compression, needle in (("none", "session.step() without a session.backward(loss) before it (each optimizer "
                                         "steps once after a backward)"),
                                ("int8", "several models train on Horovod's own reduce only")):
        proc = run([sys.executable, script, compression]) if compression != "none" else proc
        assert proc.returncode != 0     # a library call raises (the user's script decides what to print)
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("toolkit.errors.ToolkitError: ") and needle in last, proc.stderr[-2000:]


