"""Helpers several test modules share: a run's saved parameters and how two runs compare, the shared
reference run of each framework, a resumed job's checks, and tests/user_loop.py on N ranks."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys

import numpy as np

from tests.conftest import ROOT, clean_env, digits, run, run_native, train_job

LOOP = [sys.executable, str(ROOT / "tests" / "user_loop.py")]


def params(fw, checkpoint_dir) -> dict:
    """The model parameters of the newest checkpoint (written by rank 0), as numpy arrays."""
    latest = sorted(p for p in checkpoint_dir.iterdir() if p.name.startswith("ckpt-"))[-1]
    if fw == "torch":
        import torch
        return {k: v.numpy() for k, v in torch.load(latest / "state.pt", weights_only=True)["model"].items()}
    if fw == "tensorflow":
        with np.load(latest / "weights.npz") as weights:
            return {k: weights[k] for k in weights.files}
    import mxnet as mx
    return {k: v.asnumpy() for k, v in mx.nd.load(str(latest / "model.params")).items()}


def max_diff(a, b) -> float:
    """The largest difference of two runs' weights: {name: array} dicts with the same names, or lists
    of arrays of the same length."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        a, b = list(a.values()), [b[k] for k in a]
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def interrupted_copy(finished, folder) -> dict:
    """`folder` as a job that died after its first epoch would have left it: a copy of `finished`
    (a 2-epoch run) without its later checkpoints. Saves running the 1-epoch job separately.
    Returns what `assert_resumed` checks: the kept checkpoint's meta and its files' hashes."""
    shutil.copytree(finished, folder)
    kept, *later = sorted(p for p in folder.iterdir() if p.name.startswith("ckpt-"))
    for p in later:
        shutil.rmtree(p)
    return {"meta": json.loads((kept / "meta.json").read_text()), "folder": kept, "files": file_hashes(kept)}


def file_hashes(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def assert_resumed(resumed: dict, straight: dict, cut: dict) -> None:
    """The resumed job started at the cut's step and ran only the steps after it (a resume that
    silently retrained from step 0 reaches the same parameters, but not these counts), it left the
    checkpoint it resumed from untouched, and it ended where the uninterrupted job ended."""
    step = cut["meta"]["step"]
    assert 0 < step < straight["steps"]
    assert resumed["resumed_from"] == step and straight["resumed_from"] is None
    assert resumed["steps_run"] == straight["steps"] - step and resumed["steps"] == straight["steps"]
    assert file_hashes(cut["folder"]) == cut["files"], "the checkpoint resumed from was rewritten"


_BASELINES: dict = {}


def baseline(fw, tmp_path_factory) -> tuple[dict, dict]:
    """(summary, parameters) of the reference run, made once per framework and shared by the tests
    that compare against it: 2 ranks (gloo), 1 epoch, the default SGD (lr 0.05, momentum 0.9).
    Its Horovod timeline is `baseline_timeline(fw)`."""
    if fw not in _BASELINES:
        folder = tmp_path_factory.mktemp(f"baseline-{fw}")
        out = train_job("gloo", digits(fw) + ["--epochs", "1", "--checkpoint-dir", folder,
                                              "--timeline-file", folder / "timeline.json"])
        _BASELINES[fw] = (out, params(fw, folder), folder / "timeline.json")
    return _BASELINES[fw][:2]


def baseline_timeline(fw, tmp_path_factory):
    baseline(fw, tmp_path_factory)
    return _BASELINES[fw][2]


def engine(fw: str) -> tuple[str, str | None]:
    """(framework, backend) of a test's `fw`: "torch", or "torch-native" (torch's own engine)."""
    framework, _, backend = fw.partition("-")
    return framework, backend or None


def user_loop(fw, out, *args, ranks=2, timeout=300) -> dict:
    """tests/user_loop.py on `ranks` ranks (toolkit launch: Gloo, or torchrun for "torch-native"); rank 0's
    record and final weights."""
    framework, backend = engine(fw)
    argv = LOOP + ["--framework", framework, "--out", out, *args]
    if ranks > 1:
        how = ["--backend", backend, "--framework", framework] if backend else ["--gloo"]
        argv = [sys.executable, "-m", "toolkit", "launch", "-np", ranks, *how, "--timeout", timeout - 10, "--",
                *argv]
    proc = (run_native(argv, timeout=timeout, env=clean_env(TOOLKIT_BACKEND=backend)) if backend == "native" else
            run(argv, timeout=timeout, env=clean_env(TOOLKIT_BACKEND=backend) if backend else None))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    record = json.loads(open(out).read())
    with np.load(str(out) + ".npz") as saved:
        record["weights"] = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return record


def script_ranks(script, case, out, *args, ranks=2, timeout=300) -> list[dict]:
    """A user script of tests/ (`script CASE --out OUT ...`, each rank writing `OUT.<rank>.json`) on
    `ranks` ranks through `toolkit launch` (Gloo); every rank's record."""
    argv = [sys.executable, str(script), case, "--out", out, *args]
    if ranks > 1:
        argv = [sys.executable, "-m", "toolkit", "launch", "-np", ranks, "--gloo", "--timeout", timeout - 10, "--",
                *argv]
    proc = run(argv, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads(open(f"{out}.{rank}.json").read()) for rank in range(ranks)]


def assert_every_sample_once(records, n):
    """Every rank's `seen` indices together: each of the n samples the same number of times (once an epoch)."""
    from collections import Counter
    counts = Counter(i for r in records for i in r["seen"])
    epochs = set(counts.values())
    assert len(counts) == n and len(epochs) == 1, f"{n - len(counts)} samples unseen, counts {sorted(epochs)}"


def kill_writers(script: str, folder, trials: int, pause: tuple[float, float], seed: int = 0) -> int:
    """`python -c script folder`, `trials` times, killed with SIGKILL `pause` seconds (uniform, seeded) after its
    first line: the newest checkpoint in `folder` verifies after every kill. Returns how many kills landed inside
    a save (a hidden folder left behind)."""
    import random
    import signal
    import subprocess
    import time

    from tests.conftest import ROOT, clean_env
    from toolkit.run import checkpoint
    rng = random.Random(seed)
    inside = 0
    for _ in range(trials):
        proc = subprocess.Popen([sys.executable, "-c", script, str(folder)], cwd=ROOT, env=clean_env(),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline(), "the writer ended before its first checkpoint"
        time.sleep(rng.uniform(*pause))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        inside += any(p.name.startswith(".") for p in folder.iterdir())
        path, meta = checkpoint.latest(folder)      # raises if the newest is corrupt or half-written
        assert path.name == f"ckpt-{meta['step']:08d}"
    return inside

