"""`toolkit bench`: the statistics (pure), bad input, and a real 1- and 2-worker run with its files."""
import json

import pytest

from tests.conftest import horovod_status, one_line_error, timeline_gradient_bytes, toolkit
from toolkit.planner import bench


def test_summary_and_efficiency_arithmetic():
    one = bench.summarize({"rates": [[90.0, 110.0]]})
    two = bench.summarize({"rates": [[80.0, 80.0], [70.0, 90.0]]})
    assert one == pytest.approx({"workers": 1, "per_worker": 100.0, "spread": 1.96 * 10.0, "total": 100.0})
    assert two["per_worker"] == pytest.approx(80.0) and two["total"] == pytest.approx(160.0)
    rows = bench.with_efficiency([one, two])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.8])
    assert "| 2 | 80.0 +- " in bench.table(rows, samples_per_step=32)
    assert bench.parse_np("2, 1,2") == [1, 2]


@pytest.mark.parametrize("flags, needles", [
    (["--np", "0,2"], ["--np '0,2'", "at least 1"]),
    (["--np", "two"], ["--np 'two'", "e.g. --np 1,2"]),
    (["--iters", "0"], ["--iters 0"]),
    (["--framework", "tensorflow", "--backend", "native"], ["benchmarks/peers/mwms_tf_synthetic.py"]),
    (["--batch-size", "0"], ["batch_size=0"]),
])
def test_bad_input(flags, needles, tmp_path):
    one_line_error(toolkit("bench", "--out", str(tmp_path), *flags, timeout=60), *needles)


@pytest.mark.distributed
@pytest.mark.skipif(bool(horovod_status("torch")), reason="horovod.torch does not import")
def test_bench_measures_one_and_two_workers(tmp_path):
    proc = toolkit("bench", "--np", "1,2", "--framework", "torch", "--features", "32", "--hidden-size", "32",
                   "--warmup", "2", "--iters", "3", "--steps-per-iter", "4", "--compression", "fp16",
                   "--accumulation-steps", "2", "--out", str(tmp_path), "--quiet",
                   "--timeline-file", str(tmp_path / "timeline.json"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = report["rows"]
    assert [r["workers"] for r in rows] == [1, 2] and rows[0]["efficiency"] == 1.0
    for r in rows:
        raw = json.loads((tmp_path / f"np{r['np']}.json").read_text())["rates"]
        assert len(raw) == r["workers"] and all(len(w) == 3 and min(w) > 0 for w in raw)
        assert r["per_worker"] > 0 and r["total"] == pytest.approx(sum(sum(w) / 3 for w in raw))
        assert r["path"].startswith("horovod.torch")
    # bytes per step: none on 1 worker (Horovod skips the allreduce); on 2, what Horovod's timeline
    # (the last job's, np 2: 2 warm-up + 3 x 4 timed steps) says it reduced, as float16
    reduced, dtypes = timeline_gradient_bytes(tmp_path / "timeline.json")
    assert rows[0]["bytes_sent_per_step"] == 0 and dtypes == {"float16"}
    assert rows[1]["bytes_sent_per_step"] == reduced / (2 + 3 * 4) == 2 * rows[1]["parameters"]
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["total"] / 2 / rows[0]["total"])
    assert report["config"]["accumulation_steps"] == 2
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 1 | " in proc.stdout and "| 2 | " in proc.stdout and "efficiency" in proc.stdout
    # toolkit plan on this bench: its bytes per step are what the 2-worker job sent (fp16: 2 bytes a value)
    plan = toolkit("plan", "--bench", str(tmp_path), "--gpus", "2,4", "--gpus-per-node", "2", "--methods",
                   "none,fp16,int8", "--out", str(tmp_path / "plan"), "--compression", "fp16", timeout=120)
    assert plan.returncode == 0, plan.stderr[-3000:]
    predicted = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert predicted["rows"]["fp16"][0]["bytes_per_step"] == rows[1]["bytes_sent_per_step"]
    assert predicted["rows"]["none"][0]["bytes_per_step"] == 2 * rows[1]["bytes_sent_per_step"]
    assert [c["n"] for c in predicted["rows"]["int8"]] == [2, 4] and "recommended: " in plan.stdout
    assert (tmp_path / "plan" / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
