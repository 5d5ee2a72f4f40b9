"""Measure every communication method on real 2-rank jobs; the tables behind docs/COMMUNICATION.md.

    .venv/bin/python -m benchmarks.communication_bench --frameworks torch --epochs 3   # ~2 min: print only
    .venv/bin/python -m benchmarks.communication_bench --write-docs     # all frameworks, 10 epochs, ~15 min
    .venv/bin/python -m benchmarks.communication_bench --workload resnet18 --write-docs   # torch, ~10 min
    .venv/bin/python -m benchmarks.communication_bench --workload lm -np 4 --write-docs   # torch + TF, ~15 min

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
LM_METHODS = ("none", "fp16 (Horovod)", "bf16 + EF", "int8 + EF")
TARGET = {"digits": 0.95, "resnet18": 0.9, "lm": None}
LM_BYTES = 400_000      # the corpus: the first bytes of this Python's standard library sources, in name order


def corpus(path: Path) -> Path:
    """Real text that is the same on every run of one Python: its standard library's .py files, sorted by path,
    concatenated, cut at LM_BYTES. A small model does not learn it by heart in a few epochs (a repeated line
    would be), so the held-out loss can tell methods apart."""
    import sysconfig
    out = bytearray()
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        out += f.read_bytes()
        if len(out) >= LM_BYTES:
            break
    path.write_bytes(bytes(out[:LM_BYTES]))
    return path


def workload_flags(workload: str, folder: Path | None) -> list[str]:
    if workload == "digits":
        return ["--dataset", "digits"]
    if workload == "lm":
        return ["--model", "transformer_lm", "--dataset", f"text:{folder}", "--context", "64", "--hidden-size", "128",
                "--hidden-layers", "2", "--heads", "4", "--optimizer", "adam", "--lr", "0.002", "--batch-size", "16"]
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


def lm_table(rows: list[tuple[str, str, dict]]) -> str:
    """The LM's held-out loss (the last evaluation) against none's, in percent."""
    held = {(fw, label): out["epochs_log"][-1]["test_loss"] for fw, label, out in rows if "failed" not in out}
    lines = []
    for fw, label, out in rows:
        if "failed" in out:
            lines.append([fw, label, f"failed: {out['failed'].replace('|', '/')}", "", "", "", "", f"{out['wall_s']:.0f}"])
            continue
        base = held.get((fw, "none"), float("nan"))
        lines.append([fw, label, f"{held[fw, label]:.4f}", f"{(held[fw, label] / base - 1) * 100:+.2f}%",
                      f"{out['bytes_sent_per_step']:,.0f}", f"{out['compression_ratio']:.1f}x",
                      f"{out.get('compression_ms_per_step', 0):.2f}", f"{out['wall_s']:.0f}"])
    return common.table(["framework", "method", "held-out loss", "vs none", "bytes/step/rank", "ratio vs none",
                         "compression ms/step", "wall s"], lines)


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
    parser.add_argument("--workload", choices=("digits", "resnet18", "lm"), default="digits",
                        help="digits: the built-in MLP on digits (default); resnet18: ResNet-18 on the digits as PNGs; "
                             "lm: the transformer LM on Python's own sources (held-out loss)")
    parser.add_argument("--frameworks", default=None,
                        help="comma-separated frameworks to measure (default: all three for digits, torch for "
                             "resnet18, torch and tensorflow for lm)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per job (default 10 digits, 4 resnet18, 3 lm)")
    parser.add_argument("--only", default=None, help="comma-separated method labels to run (default: all)")
    parser.add_argument("-np", dest="np_", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per job (default 900)")
    parser.add_argument("--write-docs", action="store_true",
                        help="also write the table into docs/COMMUNICATION.md (default: print it only)")
    args = parser.parse_args()
    resnet, lm = args.workload == "resnet18", args.workload == "lm"
    frameworks = args.frameworks or ("torch" if resnet else "torch,tensorflow" if lm else "torch,tensorflow,mxnet")
    epochs = args.epochs or (4 if resnet else 3 if lm else 10)
    only = set(args.only.split(",")) if args.only else set(RESNET_METHODS if resnet else LM_METHODS if lm else
                                                           [m[0] for m in METHODS])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = None
        if resnet:
            folder = digits_folder(Path(tmp) / "digits")
        if lm:
            folder = corpus(Path(tmp) / "corpus.txt")
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
                score = (f"held-out loss {out['epochs_log'][-1]['test_loss']:.4f}" if lm else
                         f"accuracy {out['accuracy']:.4f}")
                print(f"{fw:10s} {label:40s} {score}  {out['bytes_sent_per_step']:9,.0f} B/step  "
                      f"{out['compression_ms_per_step']:.2f} ms  {out['wall_s']:.0f} s", file=sys.stderr, flush=True)
    text = lm_table(rows) if lm else table(rows, TARGET[args.workload])
    print(text)
    if args.write_docs:
        command = (f"`.venv/bin/python -m benchmarks.communication_bench --workload {args.workload} --frameworks "
                   f"{frameworks} --epochs {epochs} -np {args.np_}{' --only ...' if args.only else ''} --write-docs`")
        what = ("ResNet-18 on the digits as 32x32 PNGs, bf16" if resnet else
                f"the transformer LM, context 64, width 128, 2 blocks, on the first {LM_BYTES:,} bytes of Python "
                f"{sys.version.split()[0]}'s standard library sources, the last 10% held out" if lm else
                "digits, the MLP")
        common.write_between("COMMUNICATION.md", args.workload if args.workload != "digits" else "bench",
                             f"Made by {command} ({args.np_} ranks, {what}, {epochs} epochs, seed 42, "
                             f"{common.today()}).\n\n{text}")
    return 1 if any("failed" in out for _, _, out in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
