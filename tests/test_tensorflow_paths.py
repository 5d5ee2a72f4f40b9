"""The TensorFlow paths besides Keras 3 on Horovod (tested with every framework in test_distributed.py):
legacy tf-keras through horovod.tensorflow.keras, native MirroredStrategy (one process, two logical
CPU devices) and native MultiWorkerMirroredStrategy (two processes started by `toolkit launch
--backend native`, each with its TF_CONFIG). Same promises as everywhere: replicas that start
from different weights end identical, accumulation equals the large batch, resume is exact.
"""
import sys

import pytest

from tests.conftest import TRAIN, assert_replicas, clean_env, horovod_status, one_line_error, run, summary, train_job
from tests.helpers import assert_resumed, interrupted_copy, max_diff, params

pytestmark = pytest.mark.distributed
PATHS = ["tf_keras", "mirrored", "multi_worker_mirrored"]


def two_replicas(path: str, args, timeout: int = 300, env=None) -> dict:
    """A job with 2 data-parallel replicas on `path`."""
    args = ["--framework", "tensorflow", "--dataset", "digits", *args]
    if path == "tf_keras":
        return train_job("gloo", args + ["--keras", "tf_keras"], timeout=timeout, env=env)
    if path == "mirrored":
        return train_job("single", args + ["--backend", "native", "--strategy", "mirrored", "--num-devices", "2"],
                         timeout=timeout, env=env)
    assert path == "multi_worker_mirrored"
    return summary(run([sys.executable, "-m", "toolkit", "launch", "--framework", "tensorflow", "--backend",
                        "native", "-np", "2", "--timeout", timeout - 20, "--", *TRAIN, *args],
                       timeout=timeout, env=env))


def one_replica(path: str, args) -> dict:
    """The same path on one replica (native: mirrored on one device)."""
    args = ["--framework", "tensorflow", "--dataset", "digits", *args]
    extra = ["--keras", "tf_keras"] if path == "tf_keras" else ["--backend", "native", "--strategy", "mirrored"]
    return train_job("single", args + extra)


@pytest.fixture(params=PATHS)
def path(request):
    if request.param == "tf_keras":
        why = horovod_status("tensorflow")
        if why:
            pytest.skip(f"horovod.tensorflow does not import ({why}); run `make setup`")
    return request.param


EXPECTED_PATH = {"tf_keras": "horovod.tensorflow.keras", "mirrored": "tf.distribute.MirroredStrategy",
                 "multi_worker_mirrored": "tf.distribute.MultiWorkerMirroredStrategy"}


def test_two_replicas_start_different_and_end_identical(path, tmp_path):
    out = two_replicas(path, ["--epochs", "15", "--checkpoint-dir", tmp_path])
    assert EXPECTED_PATH[path] in out["path"], out["path"]
    assert out["world_size"] == 2 and out["processes"] == (1 if path == "mirrored" else 2)
    assert_replicas(out)
    assert out["accuracy"] > 0.90, out
    assert out["steps"] == 15 * ((1437 // 2) // 32)


_ONE_REPLICA: dict = {}


def one_replica_params(path: str, args, tmp_path_factory) -> dict:
    """The parameters after `one_replica(path, args)`; mirrored and multi-worker share theirs."""
    key = ("tf_keras" if path == "tf_keras" else "native", tuple(args))
    if key not in _ONE_REPLICA:
        folder = tmp_path_factory.mktemp("one-replica")
        one_replica(path, list(args) + ["--checkpoint-dir", folder])
        _ONE_REPLICA[key] = params("tensorflow", folder)
    return _ONE_REPLICA[key]


def test_accumulation_equals_large_batch(path, tmp_path, tmp_path_factory):
    """2 replicas x accumulation 2 x batch 8 == 1 replica x batch 32, plain SGD, with L2."""
    common = ["--epochs", "2", "--optimizer", "sgd", "--momentum", "0", "--lr", "0.1", "--weight-decay", "0.01"]
    two_replicas(path, common + ["--batch-size", "8", "--accumulation-steps", "2", "--checkpoint-dir", tmp_path / "a"])
    big = one_replica_params(path, common + ["--batch-size", "32"], tmp_path_factory)
    assert max_diff(params("tensorflow", tmp_path / "a"), big) < 1e-6
    # and not trivially: another batch size differs
    assert max_diff(one_replica_params(path, common + ["--batch-size", "16"], tmp_path_factory), big) > 1e-3


def test_resume_reaches_the_uninterrupted_parameters(path, tmp_path):
    common = ["--optimizer", "adam", "--lr", "0.01"]
    straight = two_replicas(path, common + ["--epochs", "2", "--checkpoint-dir", tmp_path / "a"])
    cut = interrupted_copy(tmp_path / "a", tmp_path / "b")
    resumed = two_replicas(path, common + ["--epochs", "2", "--resume", "--checkpoint-dir", tmp_path / "b"])
    assert_resumed(resumed, straight, cut)
    assert max_diff(params("tensorflow", tmp_path / "a"), params("tensorflow", tmp_path / "b")) < 1e-6


def test_native_strategies_compute_what_horovod_computes(tmp_path):
    """Same seeds, data order and step: mirrored, multi-worker and Horovod Keras 3 reach the same weights."""
    if horovod_status("tensorflow"):
        pytest.skip("horovod.tensorflow does not import")
    common = ["--epochs", "2", "--momentum", "0.9"]
    two_replicas("mirrored", common + ["--checkpoint-dir", tmp_path / "mirrored"])
    two_replicas("multi_worker_mirrored", common + ["--checkpoint-dir", tmp_path / "mwms"])
    train_job("gloo", ["--framework", "tensorflow", *common, "--checkpoint-dir", tmp_path / "horovod"])
    reference = params("tensorflow", tmp_path / "horovod")
    for name in ("mirrored", "mwms"):
        assert max_diff(params("tensorflow", tmp_path / name), reference) < 1e-5, name


def test_tf_use_legacy_keras_selects_tf_keras():
    out = train_job("single", ["--framework", "tensorflow", "--dataset", "synthetic", "--epochs", "1"],
                    env=clean_env(TF_USE_LEGACY_KERAS="1"))
    assert "horovod.tensorflow.keras" in out["path"]


def test_multi_worker_without_tf_config_is_a_clear_error():
    proc = run(TRAIN + ["--framework", "tensorflow", "--backend", "native", "--strategy", "multi_worker_mirrored",
                        "--epochs", "1"], timeout=120)
    one_line_error(proc, "needs TF_CONFIG", "toolkit launch --framework tensorflow --backend native")


def test_a_failing_native_worker_stops_the_job():
    """The TF_CONFIG launcher: one worker exits 3 at once, the other would wait for it forever."""
    proc = run([sys.executable, "-m", "toolkit", "launch", "--framework", "tensorflow", "--backend", "native", "-np", "2",
                "--timeout", "60",
                "--", sys.executable, "-c",
                "import json, os, sys, time; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
                "sys.exit(3) if i == 1 else time.sleep(120)"], timeout=90)
    assert proc.returncode == 3, proc.stderr
    assert "exited with code 3" in proc.stderr
