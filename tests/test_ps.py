"""Parameter-server training (issue 8): sync async_ps / ssp over mpi4py, under real mpirun jobs.

Unit: shard split, the server's numpy optimizer against torch.optim step for step. Jobs: SSP with a
straggler never lets a worker run more than `staleness` steps ahead and trains digits (every
framework); staleness 0 with one worker is synchronous SGD; the servers' checkpoints hold
parameters and optimizer state and resume to the same model; a dead worker ends the job; bad
parameters are one-line errors.
"""
import json
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from tests.conftest import (
    FRAMEWORKS,
    TRAIN,
    digits,
    horovod_status,
    one_line_error,
    rank_process,
    run,
    started,
    train_job,
)
from toolkit.config import Config, Optimizer
from toolkit.run import checkpoint, ps

pytestmark = pytest.mark.distributed


def mpirun_job(args, np_: int, timeout: int = 300) -> dict:
    return train_job("mpirun", args, np_=np_, timeout=timeout)


def test_shards_cover_the_vector_once():
    for length, servers in [(10, 1), (10, 3), (66954, 2), (5, 5)]:
        shards = ps.split(length, servers)
        assert shards[0][0] == 0 and shards[-1][1] == length and len(shards) == servers
        assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
        assert max(b - a for a, b in shards) - min(b - a for a, b in shards) <= 1


@pytest.mark.parametrize("optimizer, extra", [("sgd", {"momentum": 0.9, "weight_decay": 1e-3}),
                                              ("sgd", {"momentum": 0.0}), ("adam", {"weight_decay": 1e-3})])
def test_server_optimizer_follows_torch_optim(optimizer, extra):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    start = rng.standard_normal(50).astype(np.float32)
    config = Config(optimizer=Optimizer(optimizer), lr=0.01, **extra)
    mine, server = start.copy(), ps.ServerOptimizer(config, start.size)
    p = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = (torch.optim.SGD([p], lr=0.01, momentum=config.momentum, weight_decay=config.weight_decay)
           if optimizer == "sgd" else torch.optim.Adam([p], lr=0.01, weight_decay=config.weight_decay))
    for _ in range(20):
        g = rng.standard_normal(50).astype(np.float32)
        server.step(mine, g, 0.01)
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    np.testing.assert_allclose(mine, p.detach().numpy(), rtol=1e-5, atol=1e-6)


def ssp_violations(logs: list[dict], staleness: int) -> tuple[list, int]:
    """Recompute SSP's bound from the workers' own step logs (wall-clock times of each push and of
    the reply to it; one machine, one clock): when worker w got the reply to its push c, every other
    worker must already have sent at least c + 1 - staleness pushes (or all of its pushes).
    Returns the violations and the largest lead seen (how far the bound was really tested)."""
    violations, lead = [], 0
    for w, log in enumerate(logs):
        for c, t in enumerate(log["reply"]):
            for v, other in enumerate(logs):
                if v == w:
                    continue
                sent = sum(1 for p in other["push"] if p < t)
                lead = max(lead, c + 1 - sent)
                if sent < min(c + 1 - staleness, len(other["push"])):
                    violations.append((w, c, v, sent))
    return violations, lead


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_ssp_with_a_straggler_keeps_its_bound_and_trains_digits(fw, tmp_path):
    if why := horovod_status(fw):
        pytest.skip(f"horovod.{fw} does not import: {why}")
    # rank 0 serves, ranks 1-2 work; rank 2 is slowed down, so rank 1 runs ahead up to the bound
    out = mpirun_job([*digits(fw), "--sync", "ssp", "--staleness", "4", "--straggler", "2:15", "--epochs", "5",
                      "--log-dir", tmp_path], 3)
    print(f"{fw}: accuracy {out['accuracy']:.4f}, clock gaps {out['clock_gap_histogram']}, "
          f"staleness {out['staleness_histogram']}, {out['samples_per_sec']:.0f} samples/s")
    assert out["sync"] == "ssp" and out["staleness_bound"] == 4 and out["world_size"] == 2
    logs = [json.loads((tmp_path / f"ps-worker-{w}.json").read_text()) for w in range(2)]
    assert [len(log["push"]) for log in logs] == [5 * 22, 5 * 22]
    violations, lead = ssp_violations(logs, 4)
    assert not violations, f"a worker went on more than 4 steps ahead (worker, step, slower worker, its pushes): " \
                           f"{violations[:5]}"
    assert lead >= 2, "the straggler never let the other worker run ahead: the bound was not tested"
    assert out["clock_gap_max"] <= 4 and out["clock_gap_max"] >= 2      # the servers' own account agrees
    assert out["updates"] == out["steps"] == 2 * 5 * 22          # every gradient applied once
    assert out["accuracy"] > 0.9


def test_the_bound_check_sees_a_worker_too_far_ahead():
    """ssp_violations on made-up logs: worker 0 got the reply to its 3rd push before worker 1 sent any."""
    fast = {"push": [0.0, 1.0, 2.0], "reply": [0.5, 1.5, 2.5]}
    slow = {"push": [3.0, 4.0, 5.0], "reply": [3.5, 4.5, 5.5]}
    assert ssp_violations([fast, slow], 3) == ([], 3)
    assert ssp_violations([fast, slow], 2)[0] == [(0, 2, 1, 0)]


def _server_params(folder, step: int) -> np.ndarray:
    shards = sorted(folder.glob(f"server-*/ckpt-{step:08d}/{ps.SHARD_FILE}"))
    return np.concatenate([np.load(p)["params"] for p in shards])


@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
def test_one_worker_at_staleness_0_is_synchronous_sgd_and_the_servers_checkpoints_resume(tmp_path):
    import torch

    common = [*digits("torch"), "--epochs", "3"]
    sync = train_job("single", [*common, "--checkpoint-dir", tmp_path / "sync"])
    # 2 servers (the model sharded) and 1 worker
    ps_dir = tmp_path / "ps"
    out = mpirun_job([*common, "--sync", "ssp", "--staleness", "0", "--ps-servers", "2",
                      "--checkpoint-dir", ps_dir], 3)
    assert out["steps"] == sync["steps"] == 3 * 44 and out["clock_gap_max"] == 0 and out["staleness_max"] == 0
    state = torch.load(checkpoint.latest(tmp_path / "sync")[0] / "state.pt", weights_only=True)
    reference = np.concatenate([t.numpy().ravel() for t in state["model"].values()])
    final = _server_params(ps_dir, 132)
    np.testing.assert_allclose(final, reference, rtol=1e-4, atol=1e-5)   # float32 order of operations only
    assert abs(out["accuracy"] - sync["accuracy"]) < 0.01

    # each server checkpointed its shard: parameters + momentum, together the whole model
    for server in (0, 1):
        path, meta = checkpoint.latest(ps_dir / f"server-{server}")
        arrays = np.load(path / ps.SHARD_FILE)
        assert set(arrays.files) == {"params", "momentum"} and meta["step"] == 132 and meta["epoch"] == 3
        assert arrays["params"].shape == arrays["momentum"].shape and np.abs(arrays["momentum"]).sum() > 0
    assert final.size == reference.size
    # resume from epoch 2 (a copy cut there): the same final model as the uninterrupted run
    cut = tmp_path / "cut"
    shutil.copytree(ps_dir, cut)
    for stale in cut.glob("server-*/ckpt-00000132"):
        shutil.rmtree(stale)
    resumed = mpirun_job([*common, "--sync", "ssp", "--staleness", "0", "--ps-servers", "2",
                          "--checkpoint-dir", cut, "--resume"], 3)
    assert resumed["steps"] == 132 and resumed["param_digest"] == out["param_digest"]
    # and it really resumed: the servers started at step 88 and applied only the last epoch's updates
    assert resumed["resumed_from"] == 88 and resumed["steps_run"] == 44 and out["resumed_from"] is None


@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
def test_a_dead_worker_ends_the_job_within_60_s():
    marker = "--seed=4242"
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", "3", "--launcher", "mpirun", "--timeout", "200",
            "--", *TRAIN, *digits("torch"), "--sync", "async_ps", "--epochs", "500", marker]
    with started(argv, stderr=subprocess.STDOUT) as job:
        deadline, victim = time.monotonic() + 120, None
        while victim is None:
            assert job.poll() is None and time.monotonic() < deadline, "the job did not start"
            victim = rank_process(marker, rank=2, cpu_s=5)      # past its imports (~3 s), training
            time.sleep(0.5)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = job.wait(timeout=90)
        elapsed = time.monotonic() - killed
    print(f"the parameter-server job stopped {elapsed:.1f} s after worker 2 was killed (exit {code})")
    assert code != 0 and elapsed < 60
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])], \
        "ranks left running"


def test_more_servers_than_ranks_is_a_one_line_error():
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", "2", "--launcher", "mpirun", "--timeout", "100",
            "--", *TRAIN, *digits("torch"), "--sync", "async_ps", "--ps-servers", "2"]
    one_line_error(run(argv, timeout=120), "ps_servers=2", "2 rank(s)", "at least one worker", launched=True)
