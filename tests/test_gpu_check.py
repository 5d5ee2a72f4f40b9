"""benchmarks/gpu_check.py, the check a short visit to a GPU machine runs, tried on the CPU (its dry run)."""
import json
import subprocess
import sys

from tests.conftest import ROOT


def test_the_gpu_check_runs_dry_on_the_cpu(tmp_path):
    """benchmarks/gpu_check.py, prepared here for a short visit to a GPU machine: its dry run goes through
    every stage (the build's plan, both backends on both models against a plain loop, the exchange
    kernels) and writes its table."""
    bad = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--models", "resnet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "gpu_check: --models takes a comma-separated subset of resnet50,transformer_lm"]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "nvcc-from-pip" in proc.stderr, "the dry run shows the GPU build's plan"
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["horovod"] == "ready"
    steps = {(r["backend"], r["model"]): r for r in results["steps"]}
    assert set(steps) == {(b, m) for b in ("horovod", "native") for m in ("resnet50", "transformer_lm")}
    for r in steps.values():
        assert "failed" not in r, r
        # warm-up, two timed rounds and the counted block, one step each, through the session's own step
        assert r["toolkit_steps_taken"] == 4 and r["toolkit_steps_per_s"] > 0 and r["plain_steps_per_s"] > 0
        assert r["ratio"] == r["toolkit_steps_per_s"] / r["plain_steps_per_s"]
    assert {r["path"] for r in steps.values()} == {"horovod.torch DistributedOptimizer",
                                                   "torch.distributed DistributedDataParallel (gloo)"}
    assert [k["method"] for k in results["kernels"]] == ["bf16", "int8"]
    assert all(k["compress_ms_per_100mb"] > 0 and k["add_ms_per_100mb"] > 0 for k in results["kernels"])
    table = (tmp_path / "table.md").read_text()
    assert table.count("| resnet50 |") == 2 and table.count("| transformer_lm |") == 2 and "| int8 | cpu |" in table
