"""Real 2-rank jobs under horovodrun (gloo, MPI) and plain mpirun, on CPU, for every framework.

Each test runs once per framework whose Horovod extension is built here; the assertions are the
same for all of them: that is the toolkit's promise.
"""
import hashlib
import json
import shutil

import pytest

from tests.conftest import (
    FRAMEWORKS,
    TRAIN,
    assert_replicas,
    clean_env,
    digits,
    one_line_error,
    run,
    timeline_gradient_bytes,
    toolkit,
    train_job,
)
from tests.helpers import assert_resumed, baseline, baseline_timeline, file_hashes, interrupted_copy, max_diff, params

pytestmark = pytest.mark.distributed


# The full run to > 90% once (gloo); the other launchers train shorter (the suite's time).
# horovodrun --mpi and plain mpirun start the same MPI controller: --mpi once, for torch.
LAUNCHES = [(fw, launcher) for fw in FRAMEWORKS for launcher in ("gloo", "mpi", "mpirun")
            if launcher != "mpi" or fw == "torch"]


@pytest.mark.parametrize("fw, launcher", LAUNCHES, indirect=["fw"])
def test_two_ranks_start_different_and_end_identical(fw, launcher):
    epochs = 15 if launcher == "gloo" else 5
    out = train_job(launcher, digits(fw) + ["--epochs", str(epochs)], direct=True)   # plain horovodrun here
    assert out["world_size"] == 2 and out["framework"] == fw and out["backend"] == "horovod"
    assert_replicas(out)
    assert out["accuracy"] > (0.90 if epochs == 15 else 0.80), out
    assert out["steps"] == epochs * ((1437 // 2) // 32)
    for key in ("final_loss", "param_digest", "samples_per_sec"):
        assert key in out


_SINGLE: dict = {}


def single_run(fw, tmp_path_factory):
    """One single-process job per framework (no launcher), 2 epochs with checkpoints, shared."""
    if fw not in _SINGLE:
        folder = tmp_path_factory.mktemp(f"single-{fw}")
        _SINGLE[fw] = (train_job("single", digits(fw) + ["--epochs", "2", "--lr", "0.07", "--checkpoint-dir", folder,
                                                         "--timeline-file", folder / "timeline.json"]), folder)
    return _SINGLE[fw]


def test_single_process_runs_unchanged_and_writes_its_config(fw, tmp_path_factory):
    out, folder = single_run(fw, tmp_path_factory)
    assert out["world_size"] == 1 and len(out["initial_digests"]) == 1 and out["accuracy"] > 0.8
    # one rank: Horovod reduces no gradient, and the summary says so
    assert timeline_gradient_bytes(folder / "timeline.json") == (0, set()) and out["bytes_sent_per_step"] == 0
    proc = toolkit("config", "show", "--config", folder / "config.yaml")
    assert proc.returncode == 0 and "lr: 0.07" in proc.stdout and f"framework: {fw}" in proc.stdout


_STRAIGHT: dict = {}


def straight_run(fw, tmp_path_factory):
    """2 ranks, 2 epochs, sqrt lr scaling with a 1-epoch warm-up, checkpoints and metrics: shared by
    the lr test and the resume test (which then also resumes in the middle of the schedule)."""
    if fw not in _STRAIGHT:
        folder = tmp_path_factory.mktemp(f"straight-{fw}")
        _STRAIGHT[fw] = (train_job("gloo", digits(fw) + ["--optimizer", "sgd", "--momentum", "0.9", "--epochs", "2",
                                                         "--lr", "0.05", "--lr-scaling", "sqrt", "--warmup-epochs",
                                                         "1", "--checkpoint-dir", folder, "--log-dir",
                                                         folder / "logs"]), folder)
    return _STRAIGHT[fw]


def test_lr_scaling_and_warmup_by_world_size(fw, tmp_path_factory):
    """Warm-up from lr to lr x sqrt(2) over the first epoch's 22 steps (Goyal et al.): the last
    step of epoch 1 (step 21) trains at 21/22 of the way, epoch 2 at the scaled lr."""
    out, folder = straight_run(fw, tmp_path_factory)
    epochs = [json.loads(line) for line in (folder / "logs" / "metrics.jsonl").read_text().splitlines()]
    base, target = 0.05, 0.05 * 2 ** 0.5
    assert [e["lr"] for e in epochs] == pytest.approx([base + (target - base) * 21 / 22, target])
    assert out["lr"] == pytest.approx(target)
    assert out["accuracy"] > 0.5


def test_accumulation_equals_large_batch(fw, tmp_path):
    """2 ranks x accumulation 2 x batch 8 == 1 rank x batch 32, plain SGD."""
    common = digits(fw) + ["--epochs", "2", "--optimizer", "sgd", "--momentum", "0", "--lr", "0.1"]
    train_job("gloo", common + ["--batch-size", "8", "--accumulation-steps", "2",
                                "--checkpoint-dir", tmp_path / "acc"])
    train_job("single", common + ["--batch-size", "32", "--checkpoint-dir", tmp_path / "big"])
    assert max_diff(params(fw, tmp_path / "acc"), params(fw, tmp_path / "big")) < 1e-6
    # and not trivially: another batch size differs
    train_job("single", common + ["--batch-size", "16", "--checkpoint-dir", tmp_path / "other"])
    assert max_diff(params(fw, tmp_path / "other"), params(fw, tmp_path / "big")) > 1e-3


def test_op_sum_is_average_times_world_size(fw, tmp_path, tmp_path_factory):
    """Horovod's Sum adds each rank's mean gradient: with lr/2 it equals Average with lr
    (SGD with momentum is linear in the gradient)."""
    _, average = baseline(fw, tmp_path_factory)
    train_job("gloo", digits(fw) + ["--epochs", "1", "--op", "sum", "--lr", "0.025", "--checkpoint-dir", tmp_path])
    assert max_diff(params(fw, tmp_path), average) < 1e-6


def test_fp16_compression_close_to_none(fw, tmp_path, tmp_path_factory):
    plain, plain_params = baseline(fw, tmp_path_factory)
    fp16 = train_job("gloo", digits(fw) + ["--epochs", "1", "--compression", "fp16", "--checkpoint-dir", tmp_path,
                                           "--timeline-file", tmp_path / "timeline.json"])
    assert plain["param_digest"] != fp16["param_digest"], "fp16 must really change what is sent"
    assert max_diff(plain_params, params(fw, tmp_path)) < 5e-3
    assert abs(plain["final_loss"] - fp16["final_loss"]) < 0.01
    # the bytes each summary reports are what Horovod's timeline says it reduced, in that dtype
    for out, timeline, dtype in ((plain, baseline_timeline(fw, tmp_path_factory), "float32"),
                                 (fp16, tmp_path / "timeline.json", "float16")):
        reduced, dtypes = timeline_gradient_bytes(timeline)
        assert dtypes == {dtype} and out["bytes_sent_per_step"] == reduced / out["steps"], (out, reduced, dtypes)
    assert fp16["compression_ratio"] == 2.0


def test_resume_reaches_the_uninterrupted_parameters(fw, tmp_path, tmp_path_factory):
    straight, folder = straight_run(fw, tmp_path_factory)
    cut = interrupted_copy(folder, tmp_path / "b")
    resumed = train_job("gloo", digits(fw) + ["--optimizer", "sgd", "--momentum", "0.9", "--epochs", "2", "--lr",
                                              "0.05", "--lr-scaling", "sqrt", "--warmup-epochs", "1", "--resume",
                                              "--checkpoint-dir", tmp_path / "b"])
    assert_resumed(resumed, straight, cut)
    assert resumed["lr"] == straight["lr"]
    assert max_diff(params(fw, folder), params(fw, tmp_path / "b")) < 1e-6
    assert (tmp_path / "b" / "config.yaml").read_text().count("resume: true") == 1


def test_corrupt_checkpoint_on_resume(fw, tmp_path, tmp_path_factory):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(single_run(fw, tmp_path_factory)[1], ckpt)    # rank 0's files, as 2 ranks write
    older, newest = sorted(p for p in ckpt.iterdir() if p.name.startswith("ckpt-"))
    state = next(p.name for p in newest.iterdir() if p.name != "meta.json")
    before = hashlib.sha256((older / state).read_bytes()).hexdigest()
    (newest / state).write_bytes(b"not a checkpoint")
    proc = run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *TRAIN, *digits(fw), "--epochs", "3",
                "--resume", "--checkpoint-dir", ckpt], timeout=180)
    one_line_error(proc, newest.name, "corrupt", launched=True)
    assert hashlib.sha256((older / state).read_bytes()).hexdigest() == before


@pytest.mark.parametrize("fw", ["torch"], indirect=True)     # the check is the trainer's, before any step
def test_an_earlier_runs_checkpoints_are_not_overwritten_without_resume(fw, tmp_path, tmp_path_factory):
    used = tmp_path / "ckpt"
    shutil.copytree(single_run(fw, tmp_path_factory)[1], used)
    before = {p.name: file_hashes(p) for p in used.iterdir() if p.is_dir()}
    proc = run(TRAIN + digits(fw) + ["--epochs", "3", "--checkpoint-dir", used], timeout=120)
    one_line_error(proc, f"checkpoint_dir {used} already holds", "--resume", "new folder")
    assert {p.name: file_hashes(p) for p in used.iterdir() if p.is_dir()} == before


def test_horovod_built_without_the_framework(fw, tmp_path):
    """A Horovod whose extension for `fw` was not built (what --check-build would still tick)."""
    fake = tmp_path / "site" / "horovod"
    (fake / fw).mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / fw / "__init__.py").write_text(
        f"raise ImportError('Extension horovod.{fw} has not been built.  If this is not expected, "
        "reinstall Horovod with HOROVOD_WITH_X=1 to debug the build error.')\n")
    proc = run(TRAIN + digits(fw) + ["--epochs", "1"], env=clean_env(PYTHONPATH=str(tmp_path / "site")),
               timeout=120)
    one_line_error(proc, f"Horovod was built without {fw} support", f"toolkit build-horovod --frameworks {fw}")



@pytest.mark.parametrize("fw", ["torch", "tensorflow"], indirect=True)   # MXNet: refused in the config
def test_adasum_over_gloo_is_a_clear_error(fw):
    proc = run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *TRAIN, *digits(fw), "--epochs", "1",
                "--op", "adasum"], timeout=180)
    one_line_error(proc, "op=adasum needs Horovod's MPI controller", "--mpi", launched=True)
