"""Measure every communication method on real 2-rank jobs; the tables behind docs/COMMUNICATION.md.

    .venv/bin/python -m benchmarks.communication_bench --frameworks torch --epochs 3   # ~2 min: print only
    .venv/bin/python -m benchmarks.communication_bench --write-docs     # all frameworks, 10 epochs, ~15 min
    .venv/bin/python -m benchmarks.communication_bench --workload resnet18 --write-docs   # torch, ~10 min

Each row is one `horovodrun -np 2` training (examples/train.py, same seed and epochs), read from the
job's JSON summary: test accuracy, bytes each rank sent per optimizer step (toolkit payloads and
headers, or Horovod's dense gradients), the ratio to uncompressed float32, the time per step spent
compressing and decompressing, the training time to the target accuracy (the first evaluation at or
above it; evaluation every epoch) and the job's wall time (start-up included). `digits` trains the
built-in MLP (4,810 values); `resnet18` trains torchvision's ResNet-18 (11.2M values) on the digits
as 32x32 PNG files (examples/digits_images.py) in bf16 for 4 epochs, the real-workloads test's run. The
table goes between the workload's markers in docs/COMMUNICATION.md.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from toolkit.data.ondisk import digits_folder

ROOT = common.ROOT

# (label, flags, launcher): every method the config offers, plus error feedback switched off
DGC = ["--compression", "topk", "--topk-ratio", "0.01", "--dgc"]
METHODS = [
    ("none", [], "gloo"),
    ("fp16 (Horovod)", ["--compression", "fp16"], "gloo"),
    ("bf16 + EF", ["--compression", "bf16"], "gloo"),
    ("int8 + EF", ["--compression", "int8"], "gloo"),
    ("top-k 1% + EF", ["--compression", "topk", "--topk-ratio", "0.01"], "gloo"),
    ("top-k 1% + DGC", DGC, "gloo"),
    ("top-k 1% + DGC, no masking", DGC + ["--no-dgc-masking"], "gloo"),
    ("top-k 1% + DGC, no masking, no warm-up", DGC + ["--no-dgc-masking", "--dgc-warmup-epochs", "0"], "gloo"),
    ("PowerSGD rank 1", ["--compression", "powersgd", "--powersgd-rank", "1"], "gloo"),
    ("PowerSGD rank 2", ["--compression", "powersgd", "--powersgd-rank", "2"], "gloo"),
    ("PowerSGD rank 4", ["--compression", "powersgd", "--powersgd-rank", "4"], "gloo"),
    ("PowerSGD rank 2, first epoch whole", ["--compression", "powersgd", "--powersgd-rank", "2",
                                            "--powersgd-warmup-steps", "22"], "gloo"),
    ("top-k 1%, no EF", ["--compression", "topk", "--topk-ratio", "0.01", "--no-error-feedback"], "gloo"),
    ("top-k 0.1% + EF", ["--compression", "topk", "--topk-ratio", "0.001"], "gloo"),
    ("top-k 0.1%, no EF", ["--compression", "topk", "--topk-ratio", "0.001", "--no-error-feedback"], "gloo"),
    ("local SGD H=4", ["--sync", "local_sgd", "--local-steps", "4"], "gloo"),
    ("local SGD H=16, 44 sync warm-up steps", ["--sync", "local_sgd", "--local-steps", "16",
                                               "--sync-warmup-steps", "44"], "gloo"),
    ("Adasum (Horovod, MPI)", ["--op", "adasum"], "mpi"),
]
NO_ADASUM = {"mxnet"}      # Horovod's MXNet trainer has no Adasum (refused at config time)
RESNET_METHODS = ("none", "bf16 + EF", "top-k 1% + EF", "top-k 1% + DGC", "top-k 1% + DGC, no masking",
                  "PowerSGD rank 1", "PowerSGD rank 2", "PowerSGD rank 4", "PowerSGD rank 2, first epoch whole")
TARGET = {"digits": 0.95, "resnet18": 0.9}


def workload_flags(workload: str, folder: Path | None) -> list[str]:
    if workload == "digits":
        return ["--dataset", "digits"]
    return ["--model", "resnet18", "--dataset", f"imagefolder:{folder}", "--batch-size", "32", "--lr", "0.05",
            "--no-augment", "--precision", "bf16", "--image-size", "32"]


def run_one(framework: str, flags: list[str], launcher: str, epochs: int, np_: int, timeout: int,
            workload: list[str], log_dir: Path) -> dict:
    bin_dir = Path(sys.executable).parent
    argv = [str(bin_dir / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", f"--{launcher}",
            sys.executable, str(ROOT / "examples" / "train.py"), "--framework", framework,
            *workload, "--epochs", str(epochs), "--log-dir", str(log_dir), *flags]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "toolkit: error:" in ln or "Error" in ln]
        return {"failed": f"exit {proc.returncode}: {(lines or ['see stderr'])[-1][-200:]}", "wall_s": wall}
    line = next(ln for ln in re.sub(r"\[[\d,]+\]<stdout>:", "", proc.stdout).splitlines() if ln.startswith("{"))
    return {**json.loads(line), "wall_s": wall, "epochs_log": read_metrics(log_dir / "metrics.jsonl")}


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.is_file() else []


def time_to(out: dict, target: float) -> str:
    """Training seconds until the first evaluation at or above `target` (metrics.jsonl), or '-'."""
    for row in out.get("epochs_log", []):
        if row.get("accuracy", 0) >= target:
            return f"{row['train_seconds']:.1f} (epoch {row['epoch']})"
    return "-"


def table(rows: list[tuple[str, str, dict]], target: float) -> str:
    base = {fw: out["accuracy"] for fw, label, out in rows if label == "none" and "failed" not in out}
    lines = []
    for fw, label, out in rows:
        if "failed" in out:
            lines.append(f"| {fw} | {label} | failed: {out['failed'].replace('|', '/')} | | | | | | {out['wall_s']:.0f} |")
            continue
        delta = (out["accuracy"] - base[fw]) * 100 if fw in base else float("nan")
        lines.append([fw, label, f"{out['accuracy']:.4f}", f"{delta:+.1f}", f"{out['bytes_sent_per_step']:,.0f}",
                      f"{out['compression_ratio']:.1f}x", f"{out.get('compression_ms_per_step', 0):.2f}",
                      time_to(out, target), f"{out['wall_s']:.0f}"])
    return common.table(["framework", "method", "accuracy", "vs none (points)", "bytes/step/rank", "ratio vs none",
                         "compression ms/step", f"training s to {target:.0%}", "wall s"], lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("digits", "resnet18"), default="digits",
                        help="digits: the built-in MLP on digits (default); resnet18: ResNet-18 on the digits as PNGs")
    parser.add_argument("--frameworks", default=None,
                        help="comma-separated frameworks to measure (default: all three for digits, torch for resnet18)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per job (default 10 digits, 4 resnet18)")
    parser.add_argument("--only", default=None, help="comma-separated method labels to run (default: all)")
    parser.add_argument("-np", dest="np_", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per job (default 900)")
    parser.add_argument("--write-docs", action="store_true",
                        help="also write the table into docs/COMMUNICATION.md (default: print it only)")
    args = parser.parse_args()
    resnet = args.workload == "resnet18"
    frameworks = args.frameworks or ("torch" if resnet else "torch,tensorflow,mxnet")
    epochs = args.epochs or (4 if resnet else 10)
    only = set(args.only.split(",")) if args.only else set(RESNET_METHODS if resnet else [m[0] for m in METHODS])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = None
        if resnet:
            folder = digits_folder(Path(tmp) / "digits")
        workload = workload_flags(args.workload, folder)
        for fw in frameworks.split(","):
            for i, (label, flags, launcher) in enumerate(METHODS):
                if label not in only or (fw in NO_ADASUM and "adasum" in flags):
                    continue
                out = run_one(fw, flags, launcher, epochs, args.np_, args.timeout, workload, Path(tmp) / f"log{fw}{i}")
                rows.append((fw, label, out))
                if "failed" in out:
                    print(f"{fw:10s} {label:40s} FAILED {out['failed']}", file=sys.stderr, flush=True)
                    continue
                print(f"{fw:10s} {label:40s} accuracy {out['accuracy']:.4f}  {out['bytes_sent_per_step']:9,.0f} B/step  "
                      f"{out['compression_ms_per_step']:.2f} ms  {out['wall_s']:.0f} s", file=sys.stderr, flush=True)
    text = table(rows, TARGET[args.workload])
    print(text)
    if args.write_docs:
        command = (f"`.venv/bin/python -m benchmarks.communication_bench --workload {args.workload} --frameworks "
                   f"{frameworks} --epochs {epochs} -np {args.np_}{' --only ...' if args.only else ''} --write-docs`")
        what = "digits, the MLP" if not resnet else "ResNet-18 on the digits as 32x32 PNGs, bf16"
        common.write_between("COMMUNICATION.md", "resnet18" if resnet else "bench",
                             f"Made by {command} ({args.np_} ranks, {what}, {epochs} epochs, seed 42, "
                             f"{common.today()}).\n\n{text}")
    return 1 if any("failed" in out for _, _, out in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
