"""Synchronous allreduce against the parameter server (SSP s=1, s=4, fully async), with and without
one injected straggler; the table behind docs/ASYNC.md.

    .venv/bin/python -m benchmarks.async_bench --epochs 2          # ~3 min, print only
    .venv/bin/python -m benchmarks.async_bench --write-docs        # 3 workers, 10 epochs: ~12 min, into the doc

Every row trains `digits` (torch, MLP, batch 32 per worker, SGD lr 0.05 momentum 0.9) for the same
number of epochs, so every row sees the same number of samples. Sync runs W ranks through Horovod
(horovodrun --mpi); the parameter-server rows run 1 server + W workers under mpirun (oversubscribed
on a small machine). The straggler is the last worker, sleeping before each of its steps.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT
BIN = Path(sys.executable).parent


def job(sync: list[str], processes: int, args, straggler_rank: int | None) -> dict:
    argv = [str(BIN / "toolkit"), "launch", "-np", str(processes), "--launcher", "mpirun", "--timeout", "900", "--",
            sys.executable, str(ROOT / "examples" / "train.py"), "--framework", "torch", "--dataset", "digits",
            "--epochs", str(args.epochs), "--quiet", *sync]
    if straggler_rank is not None:
        argv += ["--straggler", f"{straggler_rank}:{args.straggler_ms}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1000, env=env, cwd=ROOT)
    lines = [ln for ln in re.sub(r"\[[\d,]+\]<stdout>:", "", proc.stdout).splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def rows(args):
    w = args.workers
    return [("sync allreduce (Horovod, MPI)", [], w, w - 1),
            ("SSP, staleness 1", ["--sync", "ssp", "--staleness", "1"], w + 1, w),
            ("SSP, staleness 4", ["--sync", "ssp", "--staleness", "4"], w + 1, w),
            ("async", ["--sync", "async_ps"], w + 1, w)]


def histogram(h: dict | None) -> str:
    if not h:
        return ""
    total = sum(h.values())
    return ", ".join(f"{k}: {100 * v / total:.0f}%" for k, v in sorted(h.items(), key=lambda kv: int(kv[0]))
                     if 100 * v / total >= 1)


def table(results, args) -> str:
    rows = []
    for strag, per_method in results.items():
        base = per_method[0][1]["samples_per_sec"]
        for name, r in per_method:
            stale = (f"{r['staleness_mean']:.2f} / {r['staleness_max']}" if "staleness_mean" in r else "0 (sync)")
            rows.append([strag, name, f"{r['samples_per_sec']:,.0f}", f"{r['samples_per_sec'] / base:.2f}",
                         f"{r['accuracy']:.4f}", stale, histogram(r.get("staleness_histogram")),
                         r.get("clock_gap_max", 0)])
    return (f"Command: `.venv/bin/python -m benchmarks.async_bench --workers {args.workers} --epochs {args.epochs} "
            f"--straggler-ms {args.straggler_ms} --write-docs`; {common.today()}, {common.cores()}, torch MLP on "
            "digits, batch 32 per worker.\n\n"
            + common.table(["straggler", "method", "samples/s", "x sync", "accuracy", "staleness (updates) mean / max",
                            "staleness distribution", "clock gap max"], rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=3, help="workers (the parameter-server rows add one server) "
                   "(default 3)")
    p.add_argument("--epochs", type=int, default=10, help="epochs of digits per row (default 10)")
    p.add_argument("--straggler-ms", type=float, default=30.0, help="sleep of the slow worker before each of "
                   "its steps (default 30)")
    p.add_argument("--write-docs", action="store_true",
                   help="also write the table into docs/ASYNC.md (default: print it only)")
    args = p.parse_args()
    results = {}
    for label, with_straggler in ((f"{args.straggler_ms:g} ms on one worker", True), ("none", False)):
        results[label] = []
        for name, sync, processes, straggler_rank in rows(args):
            r = job(sync, processes, args, straggler_rank if with_straggler else None)
            print(f"{label:>22} | {name:32} {r['samples_per_sec']:8.0f} samples/s  accuracy {r['accuracy']:.4f}",
                  flush=True)
            results[label].append((name, r))
    text = table(results, args)
    print(text)
    if args.write_docs:
        common.write_between("ASYNC.md", "async", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
