"""Mixed precision (`precision: bf16 | fp16`) and synchronized batch norm (`sync_batchnorm`), on real
2-rank jobs: what each claims is compared with a run that must equal it, and a run that must not.
"""
import re
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, TRAIN, assert_replicas, one_line_error, run, train_job
from tests.helpers import max_diff, user_loop
from toolkit.errors import ToolkitError
from toolkit.install import toolchain

pytestmark = pytest.mark.distributed


def state(out_path) -> list:
    """Parameters and buffers (BatchNorm's running statistics) rank 0 saved (tests/user_loop.py)."""
    with np.load(str(out_path) + ".state.npz") as saved:
        return [saved[f"arr_{i}"].astype(np.float64) for i in range(len(saved.files))]


@pytest.mark.parametrize("fw", ["torch", "tensorflow"])
def test_sync_batchnorm_gives_every_rank_the_statistics_of_the_union(fw, tmp_path):
    """2 ranks x batch 16 with synchronized batch norm == 1 rank x batch 32 (the same samples each
    step): weights and running statistics. Without it the ranks normalise with their own halves."""
    common = ["--epochs", "1", "--momentum", "0", "--record-steps"]     # the BatchNorm model of user_code.py
    synced = user_loop(fw, tmp_path / "sync.json", *common, "--batch-size", "16", "--set", "sync_batchnorm=true")
    user_loop(fw, tmp_path / "large.json", *common, "--batch-size", "32", ranks=1)
    user_loop(fw, tmp_path / "local.json", *common, "--batch-size", "16")
    assert len(set(synced["final_digests"])) == 1
    assert max_diff(state(tmp_path / "sync.json"), state(tmp_path / "large.json")) < 1e-5
    assert max_diff(state(tmp_path / "local.json"), state(tmp_path / "large.json")) > 1e-3, \
        "the comparison must be able to fail"


@pytest.mark.parametrize("fw", ["torch", "tensorflow", "mxnet"])
def test_bf16_trains_close_to_fp32_and_really_runs_in_bf16(fw):
    args = ["--framework", fw, "--epochs", "3", "--batch-size", "16"]
    if fw == "mxnet" and not toolchain.cpu_runs_bf16():   # no oneDNN bf16 kernels: refused, not a crash
        proc = run([sys.executable, "-m", "toolkit", "launch", "-np", 2, "--gloo", "--timeout", 100, "--",
                    *TRAIN, *args, "--precision", "bf16"], timeout=120)
        one_line_error(proc, "need AVX-512", "use precision: fp32", launched=True)
        return
    fp32 = train_job("gloo", args)
    bf16 = train_job("gloo", [*args, "--precision", "bf16"])
    assert_replicas(bf16)
    assert bf16["precision"] == "bf16" and bf16["accuracy"] > 0.9, bf16
    assert abs(bf16["accuracy"] - fp32["accuracy"]) < 0.05, (bf16["accuracy"], fp32["accuracy"])
    assert bf16["param_digest"] != fp32["param_digest"], "bf16 must change the arithmetic"


@pytest.mark.parametrize("fw", ["torch", "tensorflow"])
def test_fp16_trains_with_loss_scaling_and_a_blow_up_is_a_skipped_step_not_an_error(fw, tmp_path):
    out = train_job("gloo", ["--framework", fw, "--epochs", "3", "--batch-size", "16", "--precision", "fp16"])
    assert_replicas(out)
    assert out["precision"] == "fp16" and out["accuracy"] > 0.9 and isinstance(out["skipped_steps"], int), out
    # step 3's loss times inf: with fp16's loss scaler the step is skipped on both ranks and training goes on
    poisoned = user_loop(fw, tmp_path / "fp16.json", "--no-bn", "--epochs", "1", "--poison-step", "3",
                         "--set", "precision=fp16")
    assert poisoned["skipped_steps"] >= 1 and len(set(poisoned["final_digests"])) == 1, poisoned
    with np.load(str(tmp_path / "fp16.json") + ".npz") as saved:     # the blown-up step was not applied
        assert all(np.isfinite(saved[name]).all() for name in saved.files)
    # in fp32 the same blow-up stops every rank with the guard's line
    proc = run([sys.executable, "-m", "toolkit", "launch", "-np", 2, "--gloo", "--timeout", 110, "--", sys.executable,
                ROOT / "tests" / "user_loop.py", "--framework", fw, "--no-bn", "--epochs", "1", "--poison-step", "3",
                "--out", tmp_path / "fp32.json"], timeout=120)
    # (a user's script: the ToolkitError ends in Python's traceback, on both ranks, at the same step)
    assert proc.returncode != 0
    stopped = re.findall(r"^\[\d+\]<stderr>:toolkit\.errors\.ToolkitError: (step \d+: the loss \(averaged over the "
                         r"ranks\) is) (?:nan|inf) \(not finite\)", proc.stderr, re.M)
    # (each rank that got to print stopped at step 4; the launcher may stop the other one first)
    assert stopped and set(stopped) == {"step 4: the loss (averaged over the ranks) is"}, proc.stderr[-3000:]


@pytest.mark.parametrize("keys, needle", [
    (["--framework", "mxnet", "--precision", "fp16"], "dynamic loss scaling"),
    (["--framework", "tensorflow", "--backend", "native", "--precision", "fp16"], "use precision: fp32 or bf16"),
    (["--precision", "fp16", "--compression", "int8"], "precision=fp16"),
    (["--framework", "mxnet", "--sync-batchnorm"], "no MXNet SyncBatchNorm"),
    (["--framework", "tensorflow", "--keras", "tf_keras", "--sync-batchnorm"], "keras: keras3"),
])
def test_what_a_path_cannot_do_is_one_line(keys, needle):
    one_line_error(run([sys.executable, "-m", "toolkit", "config", "show", *keys], timeout=60), needle)


def test_mxnet_bf16_needs_avx512_and_says_so_in_one_line():
    """MXNet's bf16 operators are oneDNN's, which need AVX-512: a CPU without it is refused when the
    session starts, naming what it lacks (on such a CPU MXNet's engine fails at the first operator)."""
    from toolkit.adapters.mxnet.precision import check_bf16_cpu
    with pytest.raises(ToolkitError, match="this CPU lacks avx512bw, avx512dq, avx512f, avx512vl; use precision: fp32"):
        check_bf16_cpu(frozenset({"sse4_2", "avx2", "fma"}))
    check_bf16_cpu(toolchain.AVX512_CORE | {"avx2"})       # runs
    assert toolchain.cpu_runs_bf16(frozenset()) and not toolchain.cpu_runs_bf16(frozenset({"avx2"}))


def test_mxnet_bf16_turns_on_mxnets_amp_in_bfloat16():
    """Whatever the CPU, precision bf16 turns on MXNet's AMP with bfloat16 before a model is built
    (on a CPU without AVX-512 the session refuses first, so this is checked without running an op)."""
    code = ("from toolkit.adapters.mxnet.precision import Precision\n"
            "from mxnet.contrib import amp\n"
            "assert not amp.amp._amp_initialized\n"
            "Precision('fp32', on_cpu=False)\n"
            "assert not amp.amp._amp_initialized\n"
            "Precision('bf16', on_cpu=False)\n"
            "assert amp.amp._amp_initialized\n"
            "import mxnet as mx\n"
            "print(mx.nd.Convolution.__doc__ is not None and 'ok')\n")
    proc = run([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
