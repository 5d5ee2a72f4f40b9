"""Measure every communication method on real 2-rank jobs; the table behind docs/COMMUNICATION.md.

    .venv/bin/python examples/communication_bench.py --frameworks torch --epochs 3   # ~2 min: print only
    .venv/bin/python examples/communication_bench.py --write-docs     # all frameworks, 15 epochs, ~10 min

Each row is one `horovodrun -np 2` training of `digits` (examples/train.py, same seed and epochs),
read from the job's JSON summary: test accuracy, bytes each rank sent per optimizer step (toolkit
payloads and headers, or Horovod's dense gradients), the ratio to uncompressed float32, and the job's
wall time (start-up included). The table goes between the markers in docs/COMMUNICATION.md.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "COMMUNICATION.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

# (label, flags, launcher): every method the config offers, plus error feedback switched off
METHODS = [
    ("none", [], "gloo"),
    ("fp16 (Horovod)", ["--compression", "fp16"], "gloo"),
    ("bf16 + EF", ["--compression", "bf16"], "gloo"),
    ("int8 + EF", ["--compression", "int8"], "gloo"),
    ("top-k 1% + EF", ["--compression", "topk", "--topk-ratio", "0.01"], "gloo"),
    ("top-k 1%, no EF", ["--compression", "topk", "--topk-ratio", "0.01", "--no-error-feedback"], "gloo"),
    ("top-k 0.1% + EF", ["--compression", "topk", "--topk-ratio", "0.001"], "gloo"),
    ("top-k 0.1%, no EF", ["--compression", "topk", "--topk-ratio", "0.001", "--no-error-feedback"], "gloo"),
    ("local SGD H=4", ["--sync", "local_sgd", "--local-steps", "4"], "gloo"),
    ("local SGD H=16, 44 sync warm-up steps", ["--sync", "local_sgd", "--local-steps", "16",
                                               "--sync-warmup-steps", "44"], "gloo"),
    ("Adasum (Horovod, MPI)", ["--op", "adasum"], "mpi"),
]
NO_ADASUM = {"mxnet"}      # Horovod's MXNet trainer has no Adasum (refused at config time)


def run_one(framework: str, flags: list[str], launcher: str, epochs: int, np_: int, timeout: int) -> dict:
    bin_dir = Path(sys.executable).parent
    argv = [str(bin_dir / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", f"--{launcher}",
            sys.executable, str(ROOT / "examples" / "train.py"), "--framework", framework,
            "--dataset", "digits", "--epochs", str(epochs), *flags]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "toolkit: error:" in ln or "Error" in ln]
        return {"failed": f"exit {proc.returncode}: {(lines or ['see stderr'])[-1][-200:]}", "wall_s": wall}
    line = next(ln for ln in re.sub(r"\[[\d,]+\]<stdout>:", "", proc.stdout).splitlines() if ln.startswith("{"))
    return {**json.loads(line), "wall_s": wall}


def table(rows: list[tuple[str, str, dict]]) -> str:
    base = {fw: out["accuracy"] for fw, label, out in rows if label == "none" and "failed" not in out}
    lines = ["| framework | method | accuracy | vs none (points) | bytes/step/rank | ratio vs none | wall s |",
             "|---|---|---|---|---|---|---|"]
    for fw, label, out in rows:
        if "failed" in out:
            lines.append(f"| {fw} | {label} | failed: {out['failed'].replace('|', '/')} | | | | {out['wall_s']:.0f} |")
            continue
        delta = (out["accuracy"] - base[fw]) * 100 if fw in base else float("nan")
        ratio = out["compression_ratio"]
        lines.append(f"| {fw} | {label} | {out['accuracy']:.4f} | {delta:+.1f} | {out['bytes_sent_per_step']:,.0f} | "
                     f"{ratio:.1f}x | {out['wall_s']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default="torch,tensorflow,mxnet",
                        help="comma-separated frameworks to measure (default: all three)")
    parser.add_argument("--epochs", type=int, default=15, help="epochs of digits per job (default 15)")
    parser.add_argument("-np", dest="np_", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per job (default 600)")
    parser.add_argument("--write-docs", action="store_true",
                        help="also write the table into docs/COMMUNICATION.md (default: print it only)")
    args = parser.parse_args()
    rows = []
    for fw in args.frameworks.split(","):
        for label, flags, launcher in METHODS:
            if fw in NO_ADASUM and "adasum" in flags:
                continue
            out = run_one(fw, flags, launcher, args.epochs, args.np_, args.timeout)
            rows.append((fw, label, out))
            if "failed" in out:
                print(f"{fw:10s} {label:40s} FAILED {out['failed']}", file=sys.stderr, flush=True)
                continue
            print(f"{fw:10s} {label:40s} accuracy {out['accuracy']:.4f}  {out['bytes_sent_per_step']:9,.0f} B/step  "
                  f"{out['compression_ratio']:7.1f}x  {out['wall_s']:.0f} s", file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.write_docs:
        command = (f"`.venv/bin/python examples/communication_bench.py --frameworks {args.frameworks} "
                   f"--epochs {args.epochs} -np {args.np_} --write-docs`")
        block = f"{BEGIN}\nMade by {command} ({args.np_} ranks, digits, {args.epochs} epochs, seed 42).\n\n{text}\n{END}"
        doc = DOC.read_text()
        if BEGIN not in doc:
            raise SystemExit(f"{DOC} has no {BEGIN} ... {END} markers to write between")
        DOC.write_text(doc[:doc.index(BEGIN)] + block + doc[doc.index(END) + len(END):])
        print(f"wrote {DOC}", file=sys.stderr)
    return 1 if any("failed" in out for _, _, out in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
