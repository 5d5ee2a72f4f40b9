"""A TensorFlow user's own code on 2 ranks (issue 33), under Keras 3 and tf-keras:

- Keras `model.fit` with `session.fit_optimizer()` / `session.fit_callbacks()` on a model with
  BatchNormalization: every rank's moving statistics equal after fit, `check_replicas()` agrees;
- a Keras learning-rate schedule (the user's own class, around `CosineDecay`) given to
  `session.setup(model, optimizer)` and then to `session.fit_optimizer(optimizer)`, or to setup for
  the user's own loop: the lr read back each epoch is the same on every rank and the schedule's own
  value at the optimizer's step; `session.set_lr` refuses to overwrite it in one line;
- a user's own loop over a tf.data dataset whose elements are dicts or 3-tuples: every sample once
  per epoch across the ranks, replicas equal; under tf-keras, 2 ranks step as one rank with their
  whole batch;
- a GAN in Keras 3 and tf-keras on Horovod and on MultiWorkerMirroredStrategy: two models set up with their own
  optimizers, each stepped by name, one checkpoint with both, a run stopped mid-epoch and resumed ending where the
  uninterrupted one did;
- a user's step on MirroredStrategy's 2 devices in one process applies the gradient `op` says.

The tests launch this file itself as each rank's script (`toolkit launch -np 2 --gloo`):

    python -m toolkit launch -np 2 --gloo -- python tests/test_tf_usercode.py fit --keras keras3 --out o.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
LR, WARMUP, DECAY, BATCH = 0.1, 4, 60, 16


# -- the ranks' script ---------------------------------------------------------------------------------
def user_schedule(keras, kind: str):
    """`cosine`: keras's CosineDecay; `custom`: the user's own LearningRateSchedule (warm-up, then
    CosineDecay), not registered with Keras, as most users' are."""
    cosine = keras.optimizers.schedules.CosineDecay(LR, DECAY)
    if kind == "cosine":
        return cosine

    class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            import tensorflow as tf
            step = tf.cast(step, tf.float32)
            return tf.where(step < WARMUP, LR * (step + 1) / WARMUP, cosine(step))

        def get_config(self):
            return {}

    return WarmupCosine()


def lr_now(optimizer) -> float:
    """`optimizer.learning_rate` read back, as a user would (under a schedule: its value now)."""
    lr = optimizer.learning_rate
    return float(lr(optimizer.iterations) if callable(lr) else lr)


def fit(a, session) -> dict:
    from tests import user_code
    from toolkit.adapters.base import digest
    keras = session.keras
    model = keras.Sequential([keras.Input((user_code.FEATURES,)), keras.layers.Dense(16),
                              keras.layers.BatchNormalization(), keras.layers.ReLU(),
                              keras.layers.Dense(user_code.CLASSES)])        # rank r: seed + r, different
    initial = session.allgather_object(digest(model.get_weights()), name="initial")
    optimizer = keras.optimizers.SGD(learning_rate=user_schedule(keras, a.schedule), momentum=0.9)
    model, optimizer = session.setup(model, optimizer)
    fit_optimizer = session.fit_optimizer(optimizer)
    model.compile(optimizer=fit_optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    lrs, steps = [], []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: (
        lrs.append(lr_now(model.optimizer)), steps.append(int(model.optimizer.iterations))))
    x, y = user_code.arrays()
    mine = slice(session.rank, None, session.size)          # each rank fits its own half: its own batch statistics
    model.fit(x[mine], y[mine], batch_size=BATCH, epochs=a.epochs, shuffle=False, verbose=0,
              callbacks=session.fit_callbacks() + [record])
    moving_mean = model.non_trainable_variables[0].numpy()          # BatchNormalization's, zeros at the start
    return {"initial_digests": initial,
            "fit_digests": session.allgather_object(digest(model.get_weights()), name="fit"),
            "checked_digests": session.check_replicas(),
            "lrs": session.allgather_object(lrs, name="lrs"), "steps": steps,
            "statistics_moved": float(abs(moving_mean).max()) > 0,
            "trains_setup_optimizer": model.optimizer is session.optimizer}


def elements(kind: str, x, y, w):
    """The dataset's elements in the user's structure."""
    return {"tuple": (x, y), "triple": (x, y, w), "dict": {"features": x, "label": y, "weight": w}}[kind]


def fields(kind: str, batch):
    """(x, y, weight) of one batch in the user's structure."""
    if kind == "dict":
        return batch["features"], batch["label"], batch["weight"]
    return (*batch, None) if kind == "tuple" else batch


def loop(a, session) -> dict:
    import numpy as np
    import tensorflow as tf

    from tests import user_code
    from toolkit.errors import ToolkitError
    keras = session.keras
    l2 = keras.regularizers.l2(1e-3) if a.l2 else None    # tf-keras: session.backward adds model.losses
    model = keras.Sequential([keras.Input((user_code.FEATURES,)),
                              keras.layers.Dense(16, activation="relu", kernel_regularizer=l2),
                              keras.layers.Dense(user_code.CLASSES)])
    optimizer = keras.optimizers.SGD(learning_rate=user_schedule(keras, a.schedule), momentum=0.9)
    model, optimizer = session.setup(model, optimizer)
    x, y = user_code.arrays()
    n = len(x)
    x[:, 0] = np.arange(n, dtype=np.float32) / n             # the index travels with the sample
    w = np.linspace(0.5, 1.5, n).astype(np.float32)
    loader = session.loader(tf.data.Dataset.from_tensor_slices(elements(a.elements, x, y, w)))
    seen, lrs = {}, []
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            bx, by, bw = fields(a.elements, batch)
            seen.setdefault(epoch, []).extend(int(round(float(v) * n)) for v in bx.numpy()[:, 0])
            with tf.GradientTape() as tape:
                losses = keras.losses.sparse_categorical_crossentropy(by, model(bx, training=True), from_logits=True)
                loss = tf.reduce_mean(losses if bw is None else losses * bw)
            session.backward(loss, tape)
            session.step()
        lrs.append(lr_now(optimizer))
    refused = None
    try:
        session.set_lr(0.5)
    except ToolkitError as e:
        refused = str(e)
    if session.is_main:
        np.savez(a.out + ".npz", *session.weights())
    return {"n": n, "seen": session.allgather_object(seen, name="seen"), "final_digests": session.check_replicas(),
            "lrs": session.allgather_object(lrs, name="lrs"), "steps_per_epoch": loader.steps_per_epoch,
            "set_lr": refused, "lr_after_set_lr": lr_now(optimizer)}


def gan(a, session) -> dict:
    """Points on a ring against a generator from 4-d noise (tests/user_torch.py's GAN in Keras 3), d_opt unused
    (`step()` finds the discriminator; `d_opt` is what a user would name). The
    noise of a step is drawn from the step number, so a resumed run draws what the uninterrupted one drew."""
    import importlib

    import numpy as np
    import tensorflow as tf
    keras = importlib.import_module("tf_keras" if a.keras == "tf_keras" else "keras")
    samples, noise_size = 256, 4
    with session.scope():       # TensorFlow's strategy's (backend native); nothing on Horovod
        generator = keras.Sequential([keras.Input((noise_size,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(2)])
        discriminator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(16), keras.layers.LeakyReLU(0.2),
                                          keras.layers.Dense(1)])
        g_opt, d_opt = keras.optimizers.Adam(0.003), keras.optimizers.SGD(0.05, momentum=0.9)
    generator, g_opt = session.setup(generator, g_opt)
    discriminator, d_opt = session.setup(discriminator, d_opt)
    initial = [[w.copy() for w in m.get_weights()] for m in (generator, discriminator)]
    angle = np.random.RandomState(3).uniform(0, 2 * np.pi, samples)
    ring = np.stack([np.cos(angle), np.sin(angle)], 1).astype(np.float32)
    loader = session.loader((ring, np.arange(samples)))
    meta = session.load(a.checkpoint_dir) if a.resume else {}
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    seen, losses = [], []
    for epoch in range(meta.get("epoch", 0), a.epochs):
        loader.set_epoch(epoch)
        for real, index in loader:
            n = int(real.shape[0])
            z = tf.constant(np.random.RandomState(1000 * session.global_step).randn(n, noise_size).astype(np.float32))
            ones, zeros = tf.ones((n, 1)), tf.zeros((n, 1))
            with tf.GradientTape() as tape:
                fake = generator(z, training=True)
                d_loss = (bce(ones, discriminator(real, training=True))
                          + bce(zeros, discriminator(tf.stop_gradient(fake), training=True)))
            session.backward(d_loss, tape)
            session.step()      # every model the loss reached: the discriminator only (the fake is held apart)
            with tf.GradientTape() as tape:
                g_loss = bce(ones, discriminator(generator(z, training=True), training=True))  # D gradients too
            session.backward(g_loss, tape)
            session.step(g_opt)
            seen += index.numpy().tolist()
            losses.append([float(d_loss), float(g_loss)])
            if a.stop_at and session.global_step == a.stop_at:
                session.save(a.checkpoint_dir, epoch=epoch)
                return {"stopped": True}
        session.save(a.checkpoint_dir, epoch=epoch + 1)
    return {"seen": [i for part in session.allgather_object(seen, name="seen") for i in part], "losses": losses,
            "digests": session.check_replicas(), "global_step": session.global_step,
            "trained": [any(not np.array_equal(a, b) for a, b in zip(first, m.get_weights()))
                        for first, m in zip(initial, (generator, discriminator))],
            "weights": [float(np.sum(w)) for m in (generator, discriminator) for w in m.get_weights()]}


def applied(a, session) -> dict:
    """One step of a user's loop on a fixed batch (SGD, momentum 0): the update each weight got, divided by the
    learning rate, against the gradient of the same loss on the same batch taken here with a tape of our own."""
    import keras
    import numpy as np
    import tensorflow as tf
    with session.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(LR)
    model, optimizer = session.setup(model, optimizer)
    x = tf.constant(np.random.RandomState(0).randn(8, 4).astype(np.float32))

    def loss_and_tape():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        return loss, tape
    loss, tape = loss_and_tape()
    expected = [g.numpy() for g in tape.gradient(loss, [v.value for v in model.trainable_variables])]
    before = [v.numpy() for v in model.trainable_variables]
    session.backward(*loss_and_tape())
    session.step()
    got = [(b - v.numpy()) / LR for b, v in zip(before, model.trainable_variables)]
    ratios = [float(np.sum(g * e) / np.sum(e * e)) for g, e in zip(got, expected)]     # got = ratio x expected?
    return {"ratios": ratios, "off": max(float(np.abs(g - r * e).max() / np.abs(e).max())
                                         for g, e, r in zip(got, expected, ratios)),
            "digests": session.check_replicas(), "replicas": session.replicas}


def batches(a) -> list:
    """A 2-replica loader in one process (as MirroredStrategy's) over 8 samples, batch 2: each batch's
    structure and fields."""
    import numpy as np
    import tensorflow as tf

    from toolkit.adapters.tensorflow import data
    from toolkit.data.sampler import Sampler
    i = np.arange(8)
    ds = tf.data.Dataset.from_tensor_slices(elements(a.elements, i, i * 10, i * 100))
    sampler = Sampler(8, batch_size=2, world=2, replicas=range(2), train=False)
    return [{"structure": "dict" if isinstance(b, dict) else "triple" if len(b) == 3 else "tuple",
             "fields": [f.numpy().tolist() for f in fields(a.elements, b)]}
            for b in data.batches(ds, [None] * sampler.steps_per_epoch, sampler)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("fit", "loop", "batches", "gan", "applied"))
    p.add_argument("--keras", choices=("keras3", "tf_keras"), default="keras3")
    p.add_argument("--backend", choices=("horovod", "native"), default="horovod")
    p.add_argument("--native", nargs=3, metavar=("STRATEGY", "DEVICES", "OP"), help="backend native: strategy, "
                   "num_devices, op")
    p.add_argument("--schedule", choices=("cosine", "custom"), default="cosine")
    p.add_argument("--elements", choices=("tuple", "triple", "dict"), default="tuple")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=BATCH)
    p.add_argument("--l2", action="store_true", help="an L2 kernel regularizer in the loop's model")
    p.add_argument("--checkpoint-dir", help="gan: where it saves at every epoch's end (and at --stop-at)")
    p.add_argument("--stop-at", type=int, default=0, help="gan: save at this optimizer step and exit")
    p.add_argument("--resume", action="store_true", help="gan: from --checkpoint-dir")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    if a.mode == "batches":
        Path(a.out).write_text(json.dumps(batches(a)))
        return 0
    import toolkit
    native = dict(zip(("strategy", "num_devices", "op"), a.native)) if a.native else {}
    session = toolkit.start(framework="tensorflow", keras=a.keras, backend=a.backend, batch_size=a.batch_size,
                            optimizer="sgd", lr=LR, momentum=0.9, quiet=True, **native)
    out = {"fit": fit, "loop": loop, "gan": gan, "applied": applied}[a.mode](a, session)
    if session.is_main:
        Path(a.out).write_text(json.dumps(out))
    return 0


# -- the tests ------------------------------------------------------------------------------------------
def launch(tmp_path, *args, ranks: int = 2, name: str = "out") -> dict:
    """This file on `ranks` ranks (toolkit launch, Gloo; with `--backend native`: TensorFlow's workers, each with
    its TF_CONFIG; one rank: a plain process); rank 0's record (and the loop's final weights, as "weights")."""
    import numpy as np

    from tests.conftest import horovod_status, run
    why = horovod_status("tensorflow")
    if why:
        pytest.skip(f"horovod.tensorflow does not import ({why})")
    out = tmp_path / f"{name}-{ranks}.json"
    argv = [sys.executable, SCRIPT, *args, "--out", out]
    if ranks > 1:
        how = ["--framework", "tensorflow", "--backend", "native"] if "native" in args else ["--gloo"]
        argv = [sys.executable, "-m", "toolkit", "launch", "-np", ranks, *how, "--timeout", "290", "--", *argv]
    proc = run(argv, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    record = json.loads(out.read_text())
    if Path(f"{out}.npz").exists():
        with np.load(f"{out}.npz") as saved:
            record["weights"] = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return record


def expected_lr(schedule: str, step: int) -> float:
    """The single-process value of `user_schedule(kind)` at optimizer step `step` (CosineDecay's formula)."""
    if schedule == "custom" and step < WARMUP:
        return LR * (step + 1) / WARMUP
    return LR * 0.5 * (1 + math.cos(math.pi * min(step, DECAY) / DECAY))


def read_back_lag(keras: str) -> int:
    """`optimizer.learning_rate` under a schedule: Keras 3 gives the rate of the step to come,
    tf-keras the rate of the step it last applied."""
    return 1 if keras == "tf_keras" else 0


pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("keras", ["keras3", "tf_keras"])
def test_fit_ends_with_equal_batchnorm_statistics_and_follows_a_users_schedule(keras, tmp_path):
    out = launch(tmp_path, "fit", "--keras", keras, "--schedule", "custom", "--epochs", "3")
    assert out["initial_digests"][0] != out["initial_digests"][1]
    assert out["statistics_moved"], "the batch-norm statistics must have been trained"
    # model.get_weights() right after fit (moving statistics included): the same on both ranks
    assert len(set(out["fit_digests"])) == 1, out["fit_digests"]
    assert out["checked_digests"] == out["fit_digests"], "check_replicas had to change the model"
    steps_per_epoch = 512 // 2 // BATCH
    assert out["steps"] == [steps_per_epoch * (e + 1) for e in range(3)]
    assert out["lrs"][0] == out["lrs"][1]
    assert out["lrs"][0] == pytest.approx([expected_lr("custom", s - read_back_lag(keras)) for s in out["steps"]],
                                          rel=1e-5)
    assert out["trains_setup_optimizer"], "fit must train the optimizer the session set up (and saves)"


@pytest.mark.parametrize("keras, elements", [("keras3", "dict"), ("tf_keras", "triple")])
def test_a_users_loop_over_dict_or_triple_elements_with_a_cosine_schedule(keras, elements, tmp_path):
    out = launch(tmp_path, "loop", "--keras", keras, "--elements", elements, "--epochs", "2")
    spe, n = out["steps_per_epoch"], out["n"]
    assert spe == n // (2 * BATCH)
    for epoch in ("0", "1"):
        counts = Counter(i for per_rank in out["seen"] for i in per_rank[epoch])
        assert set(counts.values()) == {1} and len(counts) == n, f"epoch {epoch}: not every sample once"
    assert len(set(out["final_digests"])) == 1
    assert out["lrs"][0] == out["lrs"][1]
    assert out["lrs"][0] == pytest.approx([expected_lr("cosine", spe * (e + 1) - read_back_lag(keras))
                                           for e in range(2)], rel=1e-5)
    assert out["set_lr"] and "\n" not in out["set_lr"] and "set_lr" in out["set_lr"], out["set_lr"]
    assert out["lr_after_set_lr"] == out["lrs"][0][-1]


def test_two_replicas_in_one_process_get_their_shards_joined_in_the_elements_structure(tmp_path):
    """MirroredStrategy's loader (several replicas in one process): each batch keeps the dataset's
    structure, every leaf the replicas' shards one after the other (a plain process: TensorFlow's
    import sets environment variables)."""
    from tests.conftest import run
    out = tmp_path / "batches.json"
    proc = run([sys.executable, SCRIPT, "batches", "--elements", "dict", "--out", out], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert [b["structure"] for b in got] == ["dict"] * 2
    for batch, first in zip(got, (0, 4)):
        x, y, w = batch["fields"]
        assert x == [first, first + 2, first + 1, first + 3]        # replica 0's two samples, then replica 1's
        assert y == [v * 10 for v in x] and w == [v * 100 for v in x]


def test_a_tf_keras_users_loop_on_two_ranks_equals_one_rank_with_their_whole_batch(tmp_path):
    """session.backward under tf-keras: Horovod's optimizer allreduces in compute_gradients, not in
    apply_gradients, so the ranks must step through minimize; the layers' L2 terms count too."""
    from tests.helpers import max_diff
    args = ["loop", "--keras", "tf_keras", "--elements", "tuple", "--epochs", "1", "--l2"]
    two = launch(tmp_path, *args, "--batch-size", str(BATCH))
    one = launch(tmp_path, *args, "--batch-size", str(2 * BATCH), ranks=1)
    assert two["steps_per_epoch"] == one["steps_per_epoch"] == 512 // (2 * BATCH)
    assert max_diff(two["weights"], one["weights"]) < 1e-5
    no_l2 = launch(tmp_path, *args[:-1], "--batch-size", str(2 * BATCH), ranks=1, name="no-l2")
    assert max_diff(no_l2["weights"], one["weights"]) > 1e-4, "the L2 terms must have counted"


if __name__ == "__main__":
    sys.exit(main())


@pytest.mark.parametrize("keras", ["keras3", "tf_keras", "native"])
def test_a_keras_gan_trains_two_models_with_their_own_optimizers_and_resumes_exactly(tmp_path, keras):
    """Keras 3 and tf-keras on Horovod, and Keras 3 on TensorFlow's MultiWorkerMirroredStrategy (backend
    native, 2 workers): generator (Adam) and discriminator (SGD with momentum) set up one after the
    other; the discriminator's loss steps with `step()` (every model it reached: the discriminator only),
    the generator's with `step(g_opt)` (its backward also gives the discriminator gradients: dropped at
    the next backward): replicas of both identical, every sample once an epoch, one
    checkpoint holding both, and a run stopped mid-epoch and resumed ends bit for bit where the
    uninterrupted one did."""
    how = ["--backend", "native"] if keras == "native" else ["--keras", keras]
    straight = launch(tmp_path, "gan", *how, "--checkpoint-dir", str(tmp_path / "a"), name="straight")
    assert straight["global_step"] == 2 * 2 * 256 // (2 * BATCH), straight["global_step"]   # two steps a batch
    assert len(set(straight["digests"])) == 1, straight["digests"]
    assert straight["trained"] == [True, True], "both models must have stepped"
    counts = Counter(straight["seen"])
    assert len(counts) == 256 and set(counts.values()) == {2}, f"{256 - len(counts)} unseen, {set(counts.values())}"
    launch(tmp_path, "gan", *how, "--checkpoint-dir", str(tmp_path / "b"), "--stop-at", "10", name="cut")
    kept = next((tmp_path / "b").glob("ckpt-*"))
    assert sorted(p.name for p in kept.glob("*.npz") if p.name.startswith(("weights", "optimizer"))) == [
        "optimizer.npz", "optimizer1.npz", "weights.npz", "weights1.npz"]
    resumed = launch(tmp_path, "gan", *how, "--checkpoint-dir", str(tmp_path / "b"), "--resume", name="resumed")
    assert resumed["digests"] == straight["digests"], "the resumed GAN ended elsewhere"
    assert resumed["weights"] == straight["weights"]
    if keras == "native":       # the user's loop reduces as Horovod does: the same GAN, bit for bit (2 ranks)
        horovod = launch(tmp_path, "gan", "--checkpoint-dir", str(tmp_path / "h"), name="horovod")
        assert straight["weights"] == horovod["weights"], \
            (straight["weights"], horovod["weights"])


@pytest.mark.parametrize("op, ratio", [("average", 1.0), ("sum", 2.0)], ids=["average", "sum"])
def test_a_users_step_on_two_mirrored_devices_applies_the_gradient_op_says(tmp_path, op, ratio):
    """MirroredStrategy on 2 logical CPUs in one process, a user's loop: one backward(loss, tape) and step() apply
    the loss's gradient on the process's batch (op average), or the sum over the 2 replicas' halves (op sum: twice
    it, as 2 Horovod ranks with a half each sum), to both replicas' copies."""
    out = launch(tmp_path, "applied", "--backend", "native", "--native", "mirrored", "2", op, ranks=1, name=op)
    assert out["replicas"] == 2 and len(set(out["digests"])) == 1, out
    assert out["ratios"] == pytest.approx([ratio, ratio], rel=1e-5) and out["off"] < 1e-5, out
