"""Gradient clipping and the NaN/Inf guard (toolkit/exchange/numerics.py), on real 2-rank jobs.

Clipping is read back from the weights, not from what the toolkit reports: with plain SGD
(momentum 0, no weight decay) a step moves the weights by lr x the applied gradient, so
|w_after - w_before| / lr is the norm of the gradient the optimizer really applied.
"""
import json
import sys

import pytest

from tests.conftest import TRAIN, one_line_error, run
from tests.helpers import max_diff, user_loop

pytestmark = pytest.mark.distributed
CLIP = 0.5
SGD = ["--no-bn", "--epochs", "1", "--momentum", "0", "--lr", "0.2", "--record-steps"]


def test_clipping_bounds_the_reduced_gradient_and_with_accumulation_equals_the_large_batch(fw, tmp_path):
    clip = ["--set", f"clip_grad_norm={CLIP}"]
    # 2 ranks x accumulation 2 x batch 8 through backward/step, the user's loop
    small = user_loop(fw, tmp_path / "small.json", *SGD, *clip, "--batch-size", "8", "--accumulation-steps", "2")
    # 1 rank x batch 32 through train_step, the built-in trainer's verb
    large = user_loop(fw, tmp_path / "large.json", *SGD, *clip, "--batch-size", "32", "--train-step", ranks=1)
    # a bound never reached: the norms are measured and nothing is clipped
    free = user_loop(fw, tmp_path / "free.json", *SGD, "--batch-size", "32", "--train-step",
                     "--set", "clip_grad_norm=1e6", ranks=1)
    for out in (small, large):
        assert max(out["updates"]) <= CLIP * (1 + 1e-4), out["updates"]
        clipped = [(u, g) for u, g in zip(out["updates"], out["norms"]) if g > CLIP]
        assert clipped, f"no step's gradient norm was above {CLIP}: the test must clip ({out['norms']})"
        assert all(abs(u - CLIP) < 1e-3 * CLIP for u, _ in clipped), clipped
        kept = [(u, g) for u, g in zip(out["updates"], out["norms"]) if g <= CLIP * 0.99]
        assert all(abs(u - g) < 1e-3 * g for u, g in kept), kept     # below the bound: untouched
    assert max_diff(small["weights"], large["weights"]) < 1e-6, "clipping with accumulation must clip the large batch"
    # the reported norms are the reduced gradient's: unclipped, what was applied
    assert max(abs(u - g) / g for u, g in zip(free["updates"], free["norms"])) < 1e-3
    assert max_diff(free["weights"], large["weights"]) > 1e-3, "clipping must change the run"


@pytest.mark.parametrize("compression", ["int8", "local_sgd"])
def test_clipping_on_the_toolkits_exchange(compression, tmp_path):
    """The toolkit's exchange (numpy gradients) clips what it reduced, or under local SGD each rank's own."""
    how = ["--set", "sync=local_sgd"] if compression == "local_sgd" else ["--set", f"compression={compression}"]
    out = user_loop("torch", tmp_path / "out.json", *SGD, *how, "--set", f"clip_grad_norm={CLIP}",
                    "--batch-size", "16")
    updates = out["updates"]
    if compression == "local_sgd":      # every 4th step also moves to the ranks' average model: not a gradient
        updates = [u for i, u in enumerate(updates) if (i + 1) % 4]
    assert max(updates) <= CLIP * (1 + 1e-4), updates
    assert max(out["norms"]) > CLIP, "the test must clip"


def test_a_diverging_run_stops_every_rank_at_the_same_step_and_saves_nothing(fw, tmp_path):
    """`--lr 1e12`: the run the issue tried, which trained on NaN and printed NaN as JSON."""
    ckpt = tmp_path / "ckpt"
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", 2, "--gloo", "--timeout", 170, "--",
            *TRAIN, "--framework", fw, "--lr", "1e12", "--epochs", "2", "--checkpoint-dir", ckpt, "--quiet"]
    proc = run(argv, timeout=180)
    lines = [line for line in proc.stderr.splitlines() if "toolkit: error:" in line]
    line = one_line_error(proc, "not finite", "--clip-grad-norm", "--lr", launched=True)
    assert len(lines) == 2 and len({line.split("toolkit: error:")[1] for line in lines}) == 1, \
        f"both ranks must stop at the same step with the same line:\n{proc.stderr}"
    assert "step " in line
    assert not [p for p in ckpt.iterdir() if p.name.startswith("ckpt")], "no checkpoint of the broken weights"

    # without the guard the same run trains on and its JSON summary holds null, not NaN
    proc = run([*TRAIN, "--framework", fw, "--lr", "1e12", "--epochs", "1", "--no-nan-guard"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["final_loss"] is None or out["final_loss"] > 1e6, out


def test_a_diverging_parameter_server_job_stops_every_process():
    """A worker's non-finite loss aborts the MPI job (servers and workers wait in messages)."""
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", 3, "--launcher", "mpirun", "--timeout", 110, "--",
            *TRAIN, "--sync", "ssp", "--lr", "1e12", "--epochs", "2", "--quiet"]
    proc = run(argv, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_line_error(proc, "the loss is", "not finite", launched=True)
    assert "MPI_ABORT" not in proc.stderr and "ORTE_ERROR_LOG" not in proc.stderr, proc.stderr
    assert line


@pytest.mark.parametrize("keys, needle", [
    (["--clip-grad-norm", "0"], "clip_grad_norm=0.0 must be > 0"),
    (["--clip-grad-norm", "1", "--framework", "tensorflow", "--keras", "tf_keras"], "use backend: horovod with keras"),
    (["--clip-grad-norm", "1", "--framework", "tensorflow", "--backend", "native"], "before the all-reduce"),
    (["--clip-grad-norm", "1", "--op", "adasum"], "op=adasum"),
    (["--clip-grad-norm", "1", "--sync", "ssp"], "sync=ssp"),
])
def test_clipping_where_there_is_no_reduced_gradient_is_one_line(keys, needle):
    one_line_error(run([sys.executable, "-m", "toolkit", "config", "show", *keys], timeout=60), needle)


def test_the_check_itself():
    import numpy as np
    import torch

    from toolkit.errors import ToolkitError
    from toolkit.exchange import arrays, numerics
    for ops in (arrays.numpy_ops(), arrays.Torch("cpu")):     # torch's: on the device, the norm a 0-d tensor
        grads, norm = numerics.clip([ops.from_numpy(np.full(4, 3.0, np.float32)),
                                     ops.from_numpy(np.full(10, 4.0, np.float32))], 6.0, ops)
        assert float(norm) == pytest.approx(14.0)
        _, after = numerics.clip(grads, None, ops)
        assert float(after) == pytest.approx(6.0, rel=1e-5)
    bad = [torch.tensor([float("nan"), 1.0])]
    assert numerics.clip(bad, 1.0, arrays.Torch("cpu"))[0][0][1] == 1.0      # non-finite: left as it is
    numerics.check(3, 1e30, "loss")
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ToolkitError, match="step 3: the loss is"):
            numerics.check(3, bad, "loss")
