"""An MXNet Gluon user's own code as they write it (tests/user_gluon.py), at 2 ranks through `toolkit launch`:
a model whose shapes Gluon defers (layers without in_channels / in_units) in a user's loop (hybridized,
with accumulation, checkpointed and resumed) and through the built-in script; MXNet's own
FactorScheduler on the optimizer given to setup(); datasets of three fields and of dicts; a GAN (two models,
their own optimizers, one checkpoint).
"""
import sys
from collections import Counter

import numpy as np
import pytest

from tests.conftest import ROOT, horovod_status, run, train_job
from tests.helpers import assert_every_sample_once, script_ranks

pytestmark = pytest.mark.distributed
SCRIPT = str(ROOT / "tests" / "user_gluon.py")
N, STEPS_PER_EPOCH, EPOCHS = 384, 384 // (2 * 16), 3


@pytest.fixture(scope="module", autouse=True)
def horovod_mxnet():
    why = horovod_status("mxnet")
    if why:
        pytest.skip(f"horovod.mxnet does not import ({why}); run `make setup`")


def user_gluon(case, out, *args, **kw) -> list[dict]:
    """tests/user_gluon.py CASE on 2 ranks (or `ranks`); every rank's record."""
    return script_ranks(SCRIPT, case, out, *args, **kw)


@pytest.fixture(scope="module")
def explicit(tmp_path_factory) -> list[dict]:
    """The same net with every input size given, 2 ranks: what a deferred one must match."""
    return user_gluon("loop", tmp_path_factory.mktemp("explicit") / "e", "--explicit")


def assert_every_sample_once_an_epoch(records, epochs=EPOCHS):
    for epoch in range(epochs):
        counts = Counter(i for r in records for i in r["seen"][str(epoch)])
        assert len(counts) == N and set(counts.values()) == {1}, f"epoch {epoch}: {N - len(counts)} unseen"


def max_diff(a, b) -> float:
    return max(float(np.abs(np.array(x) - np.array(y)).max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("variant", [[], ["--hybridize"],
                                     ["--block", "--accumulation-steps", "2", "--batch-size", "8"]],
                         ids=["plain", "hybridize", "block-accumulation"])
def test_a_deferred_model_trains_as_with_explicit_shapes(explicit, tmp_path, variant):
    """Conv2D/BatchNorm/Dense without input sizes (a HybridSequential, hybridized or not, or a plain
    Sequential Block with accumulation): rank 1's own initialisation differs (its random stream was
    moved before the first batch), yet from the first forward pass on every rank holds rank 0's
    weights; replicas end equal, every sample is seen once an epoch, and the result is the explicit
    net's (to float precision; with accumulation BatchNorm sees micro-batches of 8, so the accuracy
    is compared)."""
    records = user_gluon("loop", tmp_path / "d", *variant)
    own = [r["own_init"] for r in records]
    assert own[0] != own[1], "rank 1's own initial weights must differ, or the broadcast is not tested"
    assert [r["after_first"] for r in records] == [own[0][0]] * 2, "every rank must train rank 0's initial weights"
    assert records[0]["digests"] == records[1]["digests"] and len(set(records[0]["digests"])) == 1
    assert_every_sample_once_an_epoch(records)
    assert records[0]["global_step"] == EPOCHS * STEPS_PER_EPOCH
    if "--accumulation-steps" in variant:
        assert records[0]["accuracy"] == pytest.approx(explicit[0]["accuracy"], abs=0.05)
    else:
        assert max_diff(records[0]["weights"], explicit[0]["weights"]) < 1e-5
        assert records[0]["accuracy"] == pytest.approx(explicit[0]["accuracy"], abs=1 / 128)
    assert records[0]["accuracy"] > 0.75, records[0]["accuracy"]


def test_a_deferred_model_resumed_before_its_first_forward_pass_ends_where_the_whole_run_did(tmp_path):
    """Checkpoint at step 6 (mid-epoch 0), stop, resume, with the toolkit's top-k exchange and its
    error-feedback residuals (state sized by the parameters): the resumed ranks load before any
    forward pass (rank 1's shapes come from rank 0's checkpoint) and end bit for bit where the
    uninterrupted run did, with the same learning rates."""
    topk = ["--compression", "topk"]
    whole = user_gluon("loop", tmp_path / "whole", *topk, "--save-at", "6", "--checkpoint-dir", tmp_path / "a")
    user_gluon("loop", tmp_path / "cut", *topk, "--save-at", "6", "--stop-at", "6", "--checkpoint-dir", tmp_path / "b")
    rest = user_gluon("loop", tmp_path / "rest", *topk, "--checkpoint-dir", tmp_path / "b", "--resume")
    assert rest[0]["global_step"] == whole[0]["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert rest[0]["digests"] == whole[0]["digests"]
    assert rest[0]["weights"] == whole[0]["weights"]
    assert rest[1]["lrs"] == rest[0]["lrs"] == whole[0]["lrs"]


def test_mxnets_factor_scheduler_on_the_optimizer_given_to_setup(explicit, tmp_path):
    """SGD(lr_scheduler=FactorScheduler(...)) given to setup(): the lr read back at each epoch's end,
    from the Trainer setup() returned, from the user's own optimizer and from their scheduler, is the
    same on every rank and the single-process schedule (1 rank, the same global batch); stepping
    the returned Trainer with Gluon's own `trainer.step(n)` trains exactly as `session.step()`."""
    import mxnet as mx
    one = user_gluon("loop", tmp_path / "one", "--explicit", "--batch-size", "32", ranks=1)
    by_trainer = user_gluon("loop", tmp_path / "trainer", "--explicit", "--trainer-step")
    schedule = mx.lr_scheduler.FactorScheduler(step=5, factor=0.7, base_lr=0.1)
    expected = [schedule(STEPS_PER_EPOCH * (epoch + 1)) for epoch in range(EPOCHS)]
    assert expected[0] > expected[-1], "the schedule must move"
    for record in explicit + one + by_trainer:
        assert record["lrs"] == [[lr] * 3 for lr in expected], (record["rank"], record["lrs"])
    assert by_trainer[0]["digests"] == explicit[0]["digests"]


def test_the_built_in_script_trains_a_deferred_user_module_as_the_explicit_one(tmp_path):
    """`--model user_gluon.py:build` (no input sizes) trains bit for bit as `build_explicit`, with the
    toolkit's top-k exchange and its error-feedback residuals (sized by the parameters, from the
    first step on) and the same bytes sent; its initial digests are none (the shapes are known at
    the first batch, after they are taken)."""
    common = ["--framework", "mxnet", "--dataset", f"{SCRIPT}:load", "--epochs", "3", "--batch-size", "16",
              "--compression", "topk", "--error-feedback"]
    deferred = train_job("gloo", common + ["--model", f"{SCRIPT}:build"])
    given = train_job("gloo", common + ["--model", f"{SCRIPT}:build_explicit"])
    assert deferred["final_digests"] == given["final_digests"] and len(set(deferred["final_digests"])) == 1
    assert deferred["param_digest"] == given["param_digest"]
    assert deferred["accuracy"] == given["accuracy"] > 0.5
    assert deferred["bytes_sent_per_step"] == given["bytes_sent_per_step"] > 0     # the gradients' size, once known
    assert deferred["compression_ratio"] == given["compression_ratio"] > 10
    assert deferred["initial_digests"] == [] and len(set(given["initial_digests"])) == 2


def test_three_field_and_dict_samples(tmp_path):
    """Samples of (image, label, index) come as 3-field batches, every sample once an epoch; the
    held-out set as dict samples (batched key by key) and through a batchify_fn that makes dicts,
    with `evaluate(metric=...)`, gives exactly what `evaluate` gives on its (x, y) pairs."""
    records = user_gluon("fields", tmp_path / "f")
    r = records[0]
    assert r["arity"] == [3]
    assert_every_sample_once_an_epoch(records)
    assert r["by_records"] == r["by_batchify"] == r["by_pair"], (r["by_records"], r["by_batchify"], r["by_pair"])
    assert r["by_pair"][1] > 0.75
    assert r["digests"] == records[1]["digests"] and len(set(r["digests"])) == 1


def test_a_gan_trains_two_models_with_their_own_optimizers_and_resumes_exactly(tmp_path):
    """Generator (Adam) and discriminator (SGD with momentum) set up one after the other, each stepped
    with its own optimizer (the generator's backward also gives the discriminator gradients: dropped at
    the next backward): replicas of both identical, every sample once, and a run stopped mid-epoch and
    resumed from its checkpoint ends bit for bit where the uninterrupted one did (tests/user_torch.py's
    GAN, in Gluon)."""
    straight = user_gluon("gan", tmp_path / "straight", "--epochs", "2", "--checkpoint-dir", tmp_path / "a")
    for r in straight:
        assert r["global_step"] == 2 * 2 * 256 // (2 * 16), r["global_step"]     # two optimizer steps a batch
        assert len(set(r["digests"])) == 1, r["digests"]
    assert straight[0]["digests"] == straight[1]["digests"]
    assert_every_sample_once(straight, 256)
    user_gluon("gan", tmp_path / "cut", "--epochs", "2", "--checkpoint-dir", tmp_path / "b", "--stop-at", "10")
    assert sorted(p.name for p in next((tmp_path / "b").glob("ckpt-*")).glob("*.params")) == ["model.params",
                                                                                               "model1.params"]
    resumed = user_gluon("gan", tmp_path / "resumed", "--epochs", "2", "--checkpoint-dir", tmp_path / "b",
                         "--resume")
    assert resumed[0]["digests"] == straight[0]["digests"], "the resumed GAN ended elsewhere"
    assert resumed[0]["weights"] == straight[0]["weights"]


CODE = """
import sys
import toolkit
from toolkit.errors import ToolkitError
from tests import user_gluon
session = toolkit.start(framework="mxnet", checkpoint_dir=sys.argv[1], sync=sys.argv[2])
try:
    if sys.argv[3] == "second":
        session.setup(user_gluon.net(explicit=True))
    session.setup(user_gluon.net())
    session.save()
except ToolkitError as e:
    print(e)
"""


@pytest.mark.parametrize("sync, models, needles", [
    ("every_step", "one", ["session.save(): the model's shapes are not known yet", "run a step first",
                           "in_channels"]),
    ("async_ps", "one", ["parameters of unknown shape (conv", "sync=async_ps", "in_units/in_channels"]),
    ("every_step", "second", ["second model whose shapes Gluon defers", "in_units/in_channels"]),
], ids=["save", "parameter-server", "second-model"])
def test_what_needs_the_shapes_before_the_first_forward_pass_is_one_line(tmp_path, sync, models, needles):
    proc = run([sys.executable, "-c", CODE, tmp_path / "ckpt", sync, models], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
