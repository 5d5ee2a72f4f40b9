"""Horovod's own TensorFlow API on Keras 3 (the build's `keras3-api` row) and a quiet `horovodrun` that
imports no framework (`launcher-no-framework`).

The jobs run the installed Horovod's compiled core with the Python files that the patches of this
checkout (toolkit/install/horovod_patches.py) make of Horovod's sdist, so they test the patches
themselves without a 12-minute rebuild; test_horovod_build.py's
test_the_installed_horovod_carries_todays_patches checks that the installed build was made with them.

Horovod's own TF2 example scripts run at 2 ranks under Keras 3 (tests/horovod_examples/: v0.28.1's
files, byte for byte, checked by their git blob ids; Horovod's sdist does not ship its examples). They
run with the scripts' own flags, small: `--model TinyNet` names a small convolutional network (6
weights) that the test's sitecustomize adds to `keras.applications` (ResNet-50 takes minutes on 2 CPU
cores), and the same sitecustomize prints a digest of each rank's trainable weights when the script
exits: the ranks start from different random weights and train on different random data, so equal digests mean Horovod's
broadcast and allreduce both worked. Two scripts hold one Keras 2-only line each, replaced by its Keras
3 form in the copy that runs (and nothing else): `opt.variables()` (a property in Keras 3) and
`compile(..., experimental_run_tf_function=False)` (no such argument in Keras 3).
Out of scope: tensorflow2_mnist*.py, tensorflow2_keras_mnist*.py, the elastic MNIST scripts and
examples/keras/*.py download MNIST or ImageNet; the data-service scripts need MNIST and a tf.data
service; examples/keras/*.py also use standalone Keras 2 arguments (`lr=`).
The API this leaves unexercised (eager broadcast, the partial tape, groups, SyncBatchNormalization,
the Keras callbacks' values, the refusals) is run by `api_checks` below, this file run as a script on
each rank.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

if __name__ == "__main__":            # a rank of test_horovods_tensorflow_api_on_keras3_variables_and_optimizers
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import BIN, ROOT, clean_env, horovod_status, started  # noqa: E402

EXAMPLES = ROOT / "tests" / "horovod_examples"
pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    """A folder for PYTHONPATH holding `horovod`: the installed package (its compiled extensions, its
    metadata.json) with the Python files of Horovod's sdist as the patch rows (in_key) leave them."""
    why = horovod_status("tensorflow")
    if why:
        pytest.skip(f"horovod.tensorflow does not import ({why}); run `make setup`")
    if int(metadata.version("keras").split(".")[0]) < 3:
        pytest.skip("Keras 2 is installed: these run Horovod's TensorFlow API on Keras 3")
    from toolkit.errors import ToolkitError
    from toolkit.install import horovod as hb
    from toolkit.install import horovod_patches as hp
    from toolkit.install import workarounds as wa
    try:
        source = hb._unpack(None, tmp_path_factory.mktemp("sdist"))
    except ToolkitError:
        pytest.skip("no package index to download Horovod's sdist from")
    for w in wa.WORKAROUNDS:
        if w.in_key:
            hp.apply_edits(source, w.name, w.edits)
    root = tmp_path_factory.mktemp("patched")
    installed = Path(list(importlib.util.find_spec("horovod").submodule_search_locations)[0])
    shutil.copytree(installed, root / "horovod", ignore=shutil.ignore_patterns("__pycache__"))
    for py in (source / "horovod").rglob("*.py"):
        if (root / py.relative_to(source)).exists():
            shutil.copyfile(py, root / py.relative_to(source))
    return root


HARNESS = '''
import atexit, hashlib, os, sys


class _AddTinyNet:
    """keras.applications.TinyNet: what the scripts' --model flag picks, 224x224x3 in, 1000 classes out."""
    def find_spec(self, name, path=None, target=None):
        if name != "keras.applications":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.TinyNet = _tiny_net

        spec.loader.exec_module = exec_module
        return spec


def _tiny_net(weights=None):
    import keras
    return keras.Sequential([keras.Input((224, 224, 3)), keras.layers.Conv2D(4, 8, strides=8),
                             keras.layers.BatchNormalization(), keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(1000, activation="softmax")])


def _digest():
    model = getattr(sys.modules.get("__main__"), "model", None)
    if model is not None:
        import numpy as np
        h = hashlib.sha256()
        for w in model.trainable_weights:
            h.update(np.ascontiguousarray(np.asarray(w)).tobytes())
        print(f"DIGEST rank={os.environ.get('HOROVOD_RANK')} n={len(model.trainable_weights)} "
              f"{h.hexdigest()[:16]}", flush=True)


sys.meta_path.insert(0, _AddTinyNet())
atexit.register(_digest)
'''

SMALL = ["--model", "TinyNet", "--batch-size", "2", "--num-iters", "2", "--num-batches-per-iter", "2", "--no-cuda"]
# file: (its git blob id at Horovod v0.28.1, its one Keras 2-only text and that text in Keras 3, its flags)
SCRIPTS = {
    "tensorflow2_synthetic_benchmark.py": (
        "050aa27bb45a0e4e7ab327f215f6fd3f29dae3e1", ("opt.variables()", "opt.variables"),
        SMALL + ["--num-warmup-batches", "1"]),
    "tensorflow2_keras_synthetic_benchmark.py": (
        "543c9dc3eb856c6ca107adaf693895283a1941fd", (",\n              experimental_run_tf_function=False)", ")"),
        SMALL),
    "tensorflow2_synthetic_benchmark_elastic.py": ("c79424b025374d6e6110aa0ed47c126451598ba8", None,
                                                   SMALL + ["--num-warmup-batches", "1"]),
}


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _env(*pythonpath, **extra) -> dict:
    env = clean_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (*map(str, pythonpath), env.get("PYTHONPATH"))))
    return env


def horovodrun(*argv, cwd, pythonpath, timeout=300) -> tuple[int, str]:
    """`horovodrun -np 2 --gloo ARGV`: its exit code and its output (stdout and stderr, one string)."""
    with started([BIN / "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60", *argv],
                 env=_env(*pythonpath), cwd=cwd, stderr=subprocess.STDOUT) as job:
        out, _ = job.communicate(timeout=timeout)
    return job.returncode, out


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_horovods_own_tf2_examples_run_on_keras3_with_identical_replicas(script, tmp_path, patched):
    blob, keras2_line, flags = SCRIPTS[script]
    text = (EXAMPLES / script).read_bytes()
    assert _git_blob_id(text) == blob, f"{script} is not Horovod v0.28.1's"
    text = text.decode()
    if keras2_line:
        assert text.count(keras2_line[0]) == 1
        text = text.replace(*keras2_line)
    (tmp_path / script).write_text(text)
    (tmp_path / "sitecustomize.py").write_text(HARNESS)
    code, out = horovodrun(sys.executable, tmp_path / script, *flags, cwd=tmp_path, pythonpath=(tmp_path, patched))
    assert code == 0, out[-6000:]
    digests = dict(re.findall(r"DIGEST rank=(\d) n=6 (\w+)", out))
    assert sorted(digests) == ["0", "1"], out[-3000:]
    assert digests["0"] == digests["1"], "the replicas differ: a broadcast or an allreduce did not happen"


def api_checks() -> dict:
    """On each rank (2): the API the example scripts leave out, on Keras 3 variables and optimizers."""
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_k
    import keras
    import numpy as np
    import tensorflow as tf

    hvd.init()
    rank = hvd.rank()
    keras.utils.set_random_seed(rank)               # each rank its own weights and data
    x = tf.constant(np.random.default_rng(rank).normal(size=(8, 4)), tf.float32)

    def digest(values):
        return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest()[:16]

    def model():        # two Dense layers: two variables named `kernel`, two `bias`
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])

    def loss_of(m):
        return tf.reduce_mean(m(x) ** 2)

    out = {}
    m = model()
    out["initial"] = digest(m.variables)
    hvd.broadcast_variables(m.variables, root_rank=0)             # eagerly: a tf.function of Keras variables
    out["broadcast"] = digest(m.variables)

    with tf.GradientTape(persistent=True) as tape:
        loss = loss_of(m)
    out["local_grads"] = digest(tape.gradient(loss, m.trainable_variables))
    groups = [[m.layers[0].kernel, m.layers[1].kernel]]           # grouped by variable, not by (repeated) name
    grads = hvd.DistributedGradientTape(tape, groups=groups).gradient(loss, m.trainable_variables)
    out["tape_grads"] = None if any(g is None for g in grads) else digest(grads)

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))   # a Keras 3 optimizer, a custom loop

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_of(m)
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))

    step()
    step()
    out["optimizer"] = digest(m.trainable_variables)
    out["optimizer_variables"] = len(opt.variables()) == len(opt.variables) > 0

    p = model()
    hvd.broadcast_variables(p.variables, root_rank=0)
    with tf.GradientTape() as tape:
        loss = loss_of(p)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[p.layers[1]])
    keras.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, p.trainable_variables), p.trainable_variables))
    out["partial_shared"] = digest(p.layers[0].trainable_variables)
    out["partial_local"] = digest(p.layers[1].trainable_variables)

    bn = hvd.SyncBatchNormalization(momentum=0.0)                 # moving statistics = this batch's
    bn(x, training=True)
    out["batch_mean"] = np.asarray(tf.reduce_mean(x, axis=0)).tolist()
    out["sync_batch_norm"] = np.asarray(bn.moving_mean).tolist()

    logs = {"loss": float(rank)}
    hvd_k.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    out["metric"] = float(logs["loss"])

    f = model()
    f.compile(optimizer=hvd_k.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    warmup = hvd_k.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1, steps_per_epoch=2,
                                                        momentum_correction=False)
    warmup.set_model(f)
    warmup.on_train_begin()
    warmup.on_epoch_begin(0)
    warmup.on_batch_begin(0)
    out["warmup_lr"] = float(f.optimizer.learning_rate.numpy())

    refusals = []
    try:
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    except ValueError as e:
        refusals.append(str(e))
    f.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    momentum = hvd_k.callbacks.LearningRateWarmupCallback(initial_lr=0.1, steps_per_epoch=2)
    momentum.set_model(f)
    momentum.on_train_begin()
    momentum.on_epoch_begin(0)
    try:
        momentum.on_batch_begin(0)
    except ValueError as e:
        refusals.append(str(e))
    out["refusals"] = refusals
    return out


def test_horovods_tensorflow_api_on_keras3_variables_and_optimizers(patched):
    code, out = horovodrun(sys.executable, Path(__file__), "api", cwd=ROOT, pythonpath=(patched,))
    assert code == 0, out[-6000:]
    ranks = [json.loads(line) for line in re.findall(r"^\[\d\]<stdout>:API (.*)$", out, re.M)]
    assert len(ranks) == 2, out[-3000:]
    a, b = ranks
    assert a["initial"] != b["initial"] and a["broadcast"] == b["broadcast"]
    assert a["local_grads"] != b["local_grads"]
    assert a["tape_grads"] is not None and a["tape_grads"] == b["tape_grads"], "grouped gradients lost or not reduced"
    assert a["optimizer"] == b["optimizer"] and a["optimizer_variables"]
    assert a["partial_shared"] == b["partial_shared"] and a["partial_local"] != b["partial_local"]
    both = [(m + n) / 2 for m, n in zip(a["batch_mean"], b["batch_mean"])]     # equal batches: the job's mean
    assert a["sync_batch_norm"] == b["sync_batch_norm"] == pytest.approx(both, abs=1e-6), "not synchronized"
    assert a["metric"] == b["metric"] == 0.5
    assert a["warmup_lr"] == pytest.approx(0.1 * 0.5 * (0.5 + 1))    # epoch 1/2 of 1: lr/size * (epoch*(size-1) + 1)
    assert len(a["refusals"]) == 2, a["refusals"]
    assert all("\n" not in r for r in a["refusals"])
    assert "gradient_accumulation_steps" in a["refusals"][0] and "session.fit_optimizer()" in a["refusals"][0]
    assert "momentum_correction=False" in a["refusals"][1]


# -- horovodrun ------------------------------------------------------------------------------------------
NO_FRAMEWORK = '''
import os, sys


class _Refuse:
    """Any framework import in this process or one it forks leaves a mark, then fails."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "torch", "mxnet"):
            with open(os.environ["FRAMEWORK_MARK"], "a") as f:
                f.write(name + "\\n")
            raise ImportError(name + " imported by the launcher")
        return None


sys.meta_path.insert(0, _Refuse())
from horovod.runner.launch import run_commandline
sys.argv = ["horovodrun"] + sys.argv[1:]
run_commandline()
'''


def test_horovodrun_imports_no_framework_and_prints_no_tensorflow_lines(tmp_path, patched):
    """The launcher asks the build's record which controllers exist; before, it imported horovod.tensorflow
    (TensorFlow) in a fork and TensorFlow's C++ start-up lines reached its stderr. A rank's own output,
    TensorFlow's error included, still shows."""
    from toolkit.run import quiet
    mark = tmp_path / "imported"
    rank = "import tensorflow as tf; tf.reshape(tf.zeros([2]), [3])"
    env = _env(patched, FRAMEWORK_MARK=str(mark))
    launcher = [sys.executable, "-c", NO_FRAMEWORK, "-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60"]
    with started([*launcher, sys.executable, "-c", rank], env=env, stderr=subprocess.STDOUT) as job:
        out, _ = job.communicate(timeout=300)
    assert not mark.exists(), f"the launcher imported {mark.read_text().split()}"
    launcher_lines = [ln for ln in out.splitlines() if not re.match(r"\[\d\]<std(out|err)>:", ln)]
    noise = [ln for ln in launcher_lines if quiet.is_noise(ln.encode(), True) or "absl" in ln]
    assert not noise, noise
    assert job.returncode != 0 and re.search(r"^\[\d\]<stderr>:.*InvalidArgumentError", out, re.M), out[-3000:]


PROBE = '''
import importlib, os
from horovod.common import util


class _Extension:
    @staticmethod
    def gloo_built():
        return True


def _chatty_import(name, package=None):     # as TensorFlow's C++ does on import: to the descriptors
    os.write(1, b"fd1 chatter\\n")
    os.write(2, b"fd2 chatter\\n")
    return _Extension


importlib.import_module = _chatty_import     # the probe's fork inherits it
print(util._check_extension_lambda("tensorflow", lambda ext: ext.gloo_built(), "built with Gloo", False))
'''


def test_the_extension_probes_that_remain_are_muted_where_cpp_writes(patched):
    """`horovodrun --check-build` still imports each extension in a fork; Horovod mutes it by replacing
    sys.stdout and sys.stderr, which C++ (TensorFlow's start-up log) never writes to."""
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env=_env(patched))
    assert proc.returncode == 0 and proc.stdout == "True\n", proc
    assert "chatter" not in proc.stderr, proc.stderr


if __name__ == "__main__" and sys.argv[1:] == ["api"]:
    print("API " + json.dumps(api_checks()), flush=True)
