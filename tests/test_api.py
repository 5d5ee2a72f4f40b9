"""The public API with a user's own model, data and loop (tests/user_loop.py), and the built-in script
with a user's own code (`--model/--dataset pkg.module:fn`, tests/user_code.py): real 2-rank jobs in
every framework.
"""
import shutil
import sys
from collections import Counter

import pytest

from tests.conftest import ROOT, TRAIN, assert_replicas, one_line_error, run, summary, train_job
from tests.helpers import engine, max_diff, user_loop

pytestmark = pytest.mark.distributed
USER = str(ROOT / "tests" / "user_code.py")


@pytest.fixture(params=["torch", "torch-native", "tensorflow", "mxnet"])
def fw(request):
    """Every framework on Horovod, and torch on its own engine too (torchrun, DDP): the same tests."""
    from tests.conftest import horovod_status
    why = horovod_status(engine(request.param)[0])
    if why:
        pytest.skip(f"horovod.{request.param} does not import ({why}); run `make setup`")
    return request.param


def seen_per_epoch(*records) -> dict:
    """{epoch: Counter of sample indices} over every rank of the given runs."""
    counts: dict = {}
    for record in records:
        for per_rank in record["seen"]:
            for epoch, indices in per_rank.items():
                counts.setdefault(int(epoch), Counter()).update(indices)
    return counts


def test_a_user_model_with_batchnorm_starts_apart_ends_identical_and_sees_every_sample_once(fw, tmp_path):
    # torch: the calls that make the host wait for the device, counted inside backward + step (fp32 on Horovod,
    # bf16 on DDP): none, but the NaN guard's one read of the last nan_check_every (10) steps' values
    count = {"torch": ["--count-syncs"], "torch-native": ["--count-syncs", "--set", "precision=bf16"]}.get(fw, [])
    out = user_loop(fw, tmp_path / "out.json", "--epochs", "2", *count)
    if count:
        assert [calls for calls in out["syncs"][1:]] == [{"tolist": 1} if step % 10 == 0 else {}
                                                          for step in range(2, len(out["syncs"]) + 1)], out["syncs"]
    assert len(set(out["initial_digests"])) == 2, "ranks must start from different weights"
    assert len(out["final_digests"]) == 2 and len(set(out["final_digests"])) == 1, out["final_digests"]
    n, steps_per_epoch = out["n"], 512 // (2 * 16)
    for epoch, counts in seen_per_epoch(out).items():
        assert set(counts.values()) == {1}, f"epoch {epoch}: a sample seen twice"
        assert len(counts) == steps_per_epoch * 2 * 16 == n, f"epoch {epoch}: {n - len(counts)} samples not seen"


def test_the_toolkits_int8_exchange_on_three_ranks_makes_no_host_read_in_the_step(tmp_path):
    """torch hands the exchange torch tensors on every device (the CPU too): the compressed allreduce, the norm
    and the NaN guard's value stay tensors, so backward + step make no host read but the guard's every 10 steps."""
    out = user_loop("torch", tmp_path / "out.json", "--epochs", "1", "--count-syncs", "--set", "compression=int8",
                    ranks=3)
    assert out["summary"]["compression_ratio"] > 2, out["summary"]      # int8 (on a model of 740 values)
    assert out["syncs"][1:] == [{"tolist": 1} if step % 10 == 0 else {} for step in range(2, len(out["syncs"]) + 1)], \
        out["syncs"]


@pytest.mark.parametrize("fw", ["torch-native"], indirect=True)
def test_accumulation_equals_one_large_batch(fw, tmp_path):
    """2 ranks x accumulation 2 x batch 8 == 1 rank x batch 32 (plain SGD steps: no BatchNorm, whose
    statistics depend on the micro-batch). On Horovod, in every framework, the same user loop and the
    same equality with clipping on: test_numerics.py::test_clipping_bounds_..._equals_the_large_batch."""
    common = ["--no-bn", "--epochs", "1"]
    small = user_loop(fw, tmp_path / "acc.json", *common, "--batch-size", "8", "--accumulation-steps", "2")
    large = user_loop(fw, tmp_path / "big.json", *common, "--batch-size", "32", ranks=1)
    assert small["steps"] == large["steps"] == 512 // 32
    assert max_diff(small["weights"], large["weights"]) < 1e-6
    # the toolkit's float32 exchange in buckets beside the backward pass: only the last micro-batch's starts them
    buckets = user_loop(fw, tmp_path / "buckets.json", *common, "--batch-size", "8", "--accumulation-steps", "2",
                        "--set", "hierarchical_exchange=true", "--set", "overlap=true", "--set", "bucket_mb=0.001")
    assert buckets["summary"]["overlapped_buckets_per_step"] == 3, buckets["summary"]     # 676 values, 256 a bucket
    assert max_diff(buckets["weights"], large["weights"]) < 1e-6
    other = user_loop(fw, tmp_path / "other.json", *common, "--batch-size", "16", ranks=1)
    assert max_diff(other["weights"], large["weights"]) > 1e-3, "the comparison must be able to fail"


def test_resume_mid_epoch_equals_the_uninterrupted_run_and_sees_every_sample_once(fw, tmp_path):
    # 16 steps an epoch; the whole run saves after 10 (mid-epoch 0; BatchNorm's statistics synced there)
    # and nothing else: its checkpoint folder is what a run stopped after step 10 leaves (the runs are
    # deterministic; a run that stopped there saved the same files), so the resume starts from a copy of it.
    # torch and Keras 3: every batch gets noise from Python's, numpy's and the framework's generators, which
    # the checkpoint keeps per rank (MXNet's generator cannot be read back: its resume reseeds, said once)
    # The whole run saves in the background (checkpoint_async) while its step 11 onwards train: the checkpoint
    # holds step 10's state, so the resume still ends where the whole run did.
    noise = [] if fw == "mxnet" else ["--random"]
    whole = user_loop(fw, tmp_path / "whole.json", "--epochs", "2", "--save-at", "10",
                      "--checkpoint-dir", tmp_path / "a", "--set", "checkpoint_async=true", *noise)
    assert len([p for p in (tmp_path / "a").iterdir() if p.name.startswith("ckpt-")]) == 1
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    rest = user_loop(fw, tmp_path / "rest.json", "--epochs", "2", "--checkpoint-dir", tmp_path / "b", "--resume",
                     *noise)
    assert rest["steps"] == whole["steps"] == 32
    assert max_diff(rest["weights"], whole["weights"]) < 1e-6
    assert rest["final_digests"] == whole["final_digests"]
    # epoch 0: what the whole run's ranks saw in the 10 steps before the checkpoint, and the resumed run's rest
    cut = {"seen": [{"0": per_rank["0"][:10 * 16]} for per_rank in whole["seen"]]}
    counts = seen_per_epoch(cut, rest)
    assert set(counts[0].values()) == {1} and len(counts[0]) == 512 and len(counts[1]) == 512


@pytest.mark.parametrize("fw", ["torch", "torch-native", "tensorflow", "mxnet"], indirect=True)
def test_one_backward_then_each_optimizer_steps_as_one_optimizer_over_both(fw, tmp_path):
    """A backbone and a head set up with their own optimizers (MXNet: two Trainers; Keras: two models), one loss,
    2 micro-batches a step: after each backward both step (by name, in any order), and the job ends bit for bit
    where one optimizer over the whole model ends, one optimizer step counted per 2 backward passes. With
    clip_grad_norm each part's reduced gradient is clipped to the bound on its own (one clip over both would
    leave each part below it) and `session.step()` (Horovod; DDP: by name) steps both."""
    one = user_loop(fw, tmp_path / "one.json", "--epochs", "1", "--accumulation-steps", "2", "--two-optimizers", "one")
    two = user_loop(fw, tmp_path / "named.json", "--epochs", "1", "--accumulation-steps", "2",
                    "--two-optimizers", "named")
    assert len(set(two["final_digests"])) == 1 and two["final_digests"] == one["final_digests"], two
    assert max_diff(two["weights"], one["weights"]) == 0 and two["steps"] == one["steps"] == 8
    bound = 0.01
    clipped = user_loop(fw, tmp_path / "clipped.json", "--epochs", "1", "--momentum", "0", "--record-parts",
                        "--two-optimizers", "named" if fw == "torch-native" else "all", "--set", f"clip_grad_norm={bound}")
    assert len(clipped["updates"]) == 16 and len(set(clipped["final_digests"])) == 1
    assert all(abs(update - bound) < 1e-2 * bound for step in clipped["updates"] for update in step), clipped["updates"]


def test_the_built_in_script_trains_a_user_module(fw, tmp_path):
    framework, backend = engine(fw)
    out = train_job(backend or "gloo", ["--framework", framework, "--model", f"{USER}:build", "--dataset", f"{USER}:load",
                             "--epochs", "4", "--batch-size", "16", "--checkpoint-dir", tmp_path])
    assert_replicas(out)
    assert out["accuracy"] > 0.6, out       # 4 classes: chance is 0.25
    assert out["steps"] == 4 * (384 // (2 * 16))


@pytest.mark.parametrize("model, dataset, needles", [
    ("no_such_module_xyz:build", None, ["model='no_such_module_xyz:build'", "no module named", "PYTHONPATH"]),
    (f"{USER}:nope", None, ["has no `nope`", "def nope(config)"]),
    (f"{USER}:FEATURES", None, ["is a int, not a function"]),
    ("tests/no_such_file.py:build", None, ["no file tests/no_such_file.py"]),
    (f"{USER}:not_a_model", None, ["build(config) returned a dict", "expected a torch.nn.Module"]),
    (None, f"{USER}:build", ["dataset=", "load(config) must return (train, eval)"]),
    ("mlp", f"{USER}:not_datasets", ["load(config) must return (train, eval), got a list"]),
])
def test_bad_references_are_one_line_errors(model, dataset, needles):
    args = ["--framework", "torch", "--epochs", "1"]
    args += ["--model", model] if model else []
    args += ["--dataset", dataset] if dataset else []
    one_line_error(run(TRAIN + args, timeout=120), *needles)


def test_more_ranks_on_a_host_than_gpus_is_one_line_naming_the_counts():
    from toolkit.adapters.horovod import gpu_for_local_rank
    from toolkit.errors import ToolkitError
    assert gpu_for_local_rank(0, 1, 2, allow_cpu=False) is None           # no GPU: the CPU
    assert gpu_for_local_rank(2, 1, 2, allow_cpu=False) == 1
    assert gpu_for_local_rank(1, 1, 2, allow_cpu=True) is None            # allowed: the CPU
    with pytest.raises(ToolkitError, match=r"2 ranks on this host but 1 GPU\(s\).*-H host:1.*allow_cpu"):
        gpu_for_local_rank(1, 1, 2, allow_cpu=False)


@pytest.mark.parametrize("fw, script", [("torch", "your_torch.py"), ("tensorflow", "your_keras.py"),
                                        ("mxnet", "your_mxnet.py")], indirect=["fw"])
def test_the_your_script_examples_train_under_horovodrun(fw, script):
    """examples/your_*.py: a single-process script with a handful of lines changed, on 2 ranks."""
    out = summary(run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60",
                       sys.executable, ROOT / "examples" / script], timeout=300))
    assert out["framework"] == fw and out["world_size"] == 2
    assert len(out["final_digests"]) == 2 and len(set(out["final_digests"])) == 1
    assert out["accuracy"] > 0.85, out


def test_the_built_in_script_uses_the_users_loss(tmp_path):
    """The same model and data, with the module's label-smoothing `loss` and without it (a module
    that only re-exports build and load): different training, and smoothing keeps the loss higher."""
    (tmp_path / "no_loss.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                                         "from tests.user_code import build, load\n")
    common = ["--framework", "torch", "--epochs", "3", "--batch-size", "16"]
    smoothed = train_job("single", common + ["--model", f"{USER}:build", "--dataset", f"{USER}:load"])
    plain = train_job("single", common + ["--model", f"{tmp_path / 'no_loss.py'}:build",
                                          "--dataset", f"{tmp_path / 'no_loss.py'}:load"])
    assert smoothed["final_loss"] > plain["final_loss"] + 0.05, (smoothed["final_loss"], plain["final_loss"])
    assert smoothed["param_digest"] != plain["param_digest"]
