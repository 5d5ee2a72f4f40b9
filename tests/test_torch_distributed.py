"""Real 2-rank PyTorch jobs under horovodrun (gloo, MPI) and plain mpirun, on CPU."""
import hashlib
import shutil

import pytest

from tests.conftest import ROOT, TRAIN, clean_env, one_line_error, run, toolkit, train_job

torch = pytest.importorskip("torch")
pytest.importorskip("horovod.torch", reason="Horovod built with PyTorch is needed: run `make setup`")
pytestmark = pytest.mark.distributed

DIGITS = ["--framework", "torch", "--dataset", "digits"]


def params(checkpoint_dir):
    """The model parameters of the newest checkpoint (written by rank 0)."""
    latest = sorted(p for p in checkpoint_dir.iterdir() if p.name.startswith("ckpt-"))[-1]
    return torch.load(latest / "state.pt", weights_only=True)["model"]


def max_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("launcher", ["gloo", "mpi", "mpirun"])
def test_two_ranks_start_different_and_end_identical(launcher):
    out = train_job(launcher, DIGITS + ["--epochs", "15"])
    assert out["world_size"] == 2 and out["framework"] == "torch" and out["backend"] == "horovod"
    first, second = out["initial_digests"]
    assert first != second, "ranks must start from different weights so the broadcast is really tested"
    assert out["accuracy"] > 0.90, out
    assert out["steps"] == 15 * ((1437 // 2) // 32)
    for key in ("final_loss", "param_digest", "samples_per_sec"):
        assert key in out


def test_lr_scaling_and_warmup_by_world_size():
    out = train_job("gloo", DIGITS + ["--epochs", "2", "--lr", "0.05", "--lr-scaling", "sqrt",
                                      "--warmup-epochs", "1"])
    assert out["lr"] == pytest.approx(0.05 * 2 ** 0.5)
    assert out["accuracy"] > 0.5


def test_single_process_runs_unchanged():
    out = train_job("single", DIGITS + ["--epochs", "2", "--dataset", "synthetic"])
    assert out["world_size"] == 1 and len(out["initial_digests"]) == 1


def test_accumulation_equals_large_batch(tmp_path):
    """2 ranks x accumulation 2 x batch 8 == 1 rank x batch 32, plain SGD."""
    common = DIGITS + ["--epochs", "2", "--optimizer", "sgd", "--momentum", "0", "--lr", "0.1"]
    train_job("gloo", common + ["--batch-size", "8", "--accumulation-steps", "2",
                                "--checkpoint-dir", tmp_path / "acc"])
    train_job("single", common + ["--batch-size", "32", "--checkpoint-dir", tmp_path / "big"])
    assert max_diff(params(tmp_path / "acc"), params(tmp_path / "big")) < 1e-6
    # and not trivially: the other accumulation would differ
    train_job("single", common + ["--batch-size", "16", "--checkpoint-dir", tmp_path / "other"])
    assert max_diff(params(tmp_path / "other"), params(tmp_path / "big")) > 1e-3


def test_fp16_compression_close_to_none(tmp_path):
    common = DIGITS + ["--epochs", "3"]
    plain = train_job("gloo", common + ["--checkpoint-dir", tmp_path / "none"])
    fp16 = train_job("gloo", common + ["--compression", "fp16", "--checkpoint-dir", tmp_path / "fp16"])
    assert plain["param_digest"] != fp16["param_digest"], "fp16 must really change what is sent"
    assert max_diff(params(tmp_path / "none"), params(tmp_path / "fp16")) < 5e-3
    assert abs(plain["final_loss"] - fp16["final_loss"]) < 0.01


def test_resume_reaches_the_uninterrupted_parameters(tmp_path):
    common = DIGITS + ["--optimizer", "sgd", "--momentum", "0.9"]
    straight = train_job("gloo", common + ["--epochs", "4", "--checkpoint-dir", tmp_path / "a"])
    train_job("gloo", common + ["--epochs", "2", "--checkpoint-dir", tmp_path / "b"])
    resumed = train_job("gloo", common + ["--epochs", "4", "--resume", "--checkpoint-dir", tmp_path / "b"])
    assert resumed["steps"] == straight["steps"]
    assert max_diff(params(tmp_path / "a"), params(tmp_path / "b")) < 1e-6
    assert (tmp_path / "b" / "config.yaml").read_text().count("resume: true") == 1


def test_corrupt_checkpoint_on_resume(tmp_path):
    ckpt = tmp_path / "ckpt"
    train_job("gloo", DIGITS + ["--epochs", "2", "--checkpoint-dir", ckpt])
    older, newest = sorted(p for p in ckpt.iterdir() if p.name.startswith("ckpt-"))
    before = hashlib.sha256((older / "state.pt").read_bytes()).hexdigest()
    (newest / "state.pt").write_bytes(b"not a checkpoint")
    proc = run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *TRAIN, *DIGITS, "--epochs", "3",
                "--resume", "--checkpoint-dir", ckpt], timeout=180)
    one_line_error(proc, newest.name, "corrupt", launched=True)
    assert hashlib.sha256((older / "state.pt").read_bytes()).hexdigest() == before


def test_horovod_built_without_the_framework(tmp_path):
    """A Horovod whose torch extension was not built (what --check-build would still tick)."""
    fake = tmp_path / "site" / "horovod"
    (fake / "torch").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "torch" / "__init__.py").write_text(
        "raise ImportError('Extension horovod.torch has not been built.  If this is not expected, "
        "reinstall Horovod with HOROVOD_WITH_PYTORCH=1 to debug the build error.')\n")
    proc = run(TRAIN + DIGITS + ["--epochs", "1"], env=clean_env(PYTHONPATH=str(tmp_path / "site")), timeout=120)
    one_line_error(proc, "Horovod was built without torch support", "toolkit build-horovod --frameworks torch")


def test_writes_config_beside_checkpoints(tmp_path):
    train_job("single", DIGITS + ["--epochs", "1", "--checkpoint-dir", tmp_path, "--lr", "0.07"])
    proc = toolkit("config", "show", "--config", tmp_path / "config.yaml")
    assert proc.returncode == 0 and "lr: 0.07" in proc.stdout
