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
        assert r["toolkit_syncs_per_step"] == 0, r       # one step: no host read at all (else the check fails)
    assert {r["path"] for r in steps.values()} == {"horovod.torch DistributedOptimizer",
                                                   "torch.distributed DistributedDataParallel (gloo)"}
    assert [k["method"] for k in results["kernels"]] == ["bf16", "int8"]
    assert all(k["compress_ms_per_100mb"] > 0 and k["add_ms_per_100mb"] > 0 for k in results["kernels"])
    table = (tmp_path / "table.md").read_text()
    assert table.count("| resnet50 |") == 2 and table.count("| transformer_lm |") == 2 and "| int8 | cpu |" in table


def test_a_step_that_waits_for_the_device_fails_the_gpu_check():
    """Any host read, or any synchronization CUDA's sync debug mode reports, in the toolkit's step beyond the NaN
    guard's one read every `nan_check_every` steps: the row is named and the check exits 1 (a plain loop's own
    syncs do not count against it)."""
    from benchmarks import gpu_check
    row = {"model": "resnet50", "backend": "native", "toolkit_syncs_per_step": 0.1, "plain_syncs_per_step": 1.0,
           "nan_check_every": 10}
    assert gpu_check.waited([row, {**row, "model": "transformer_lm", "toolkit_cuda_syncs_per_step": 0.1}]) == []
    assert gpu_check.waited([{**row, "toolkit_syncs_per_step": 0.15}]) == ["resnet50 on native"]
    assert gpu_check.waited([{**row, "nan_check_every": 20}]) == ["resnet50 on native"]
    assert gpu_check.waited([{**row, "backend": "horovod", "toolkit_cuda_syncs_per_step": 1.0}]) == \
        ["resnet50 on horovod"]
    assert gpu_check.waited([{"model": "resnet50", "backend": "horovod", "failed": "exit 1"}]) == []
