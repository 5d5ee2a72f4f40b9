"""Time to accuracy: ResNet-18 on the digits rendered as PNG files (1797 images, 20% held out), read
by the framework's image-folder reader, 2 ranks, fp32 against bf16, side by side in one run.

    .venv/bin/python -m benchmarks.workload_bench                      # torch, 3 rounds, print only
    .venv/bin/python -m benchmarks.workload_bench --framework tensorflow --repeats 1
    .venv/bin/python -m benchmarks.workload_bench --write-docs         # into docs/BENCHMARKS.md

Each run is `examples/train.py` under `toolkit launch -np 2 --gloo` with `--log-dir`; from its
metrics.jsonl: every epoch's held-out accuracy and the training seconds up to it (samples over the
running samples/s: evaluation and start-up excluded). Time to accuracy is the training seconds of the
first epoch at or above `--target`; rows report the median over rounds.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common
from toolkit.data.ondisk import digits_folder

ROOT = common.ROOT

BIN = Path(sys.executable).parent


def one_run(a, precision: str, images: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(BIN / "toolkit"), "launch", "-np", str(a.np), "--gloo", "--timeout", str(a.timeout), "--",
                sys.executable, str(ROOT / "examples" / "train.py"), "--framework", a.framework, "--model", "resnet18",
                "--dataset", f"imagefolder:{images}", "--image-size", str(a.image_size), "--epochs", str(a.epochs),
                "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--precision", precision,
                *(["--no-augment"] if not a.augment else []), "--log-dir", tmp, "--quiet"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout + 60, cwd=ROOT)
        if proc.returncode != 0:
            return {"failed": " / ".join(proc.stderr.strip().splitlines()[-2:])[-300:]}
        epochs = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    lines = re.sub(r"\[[\d,]+\]<stdout>:", "", proc.stdout).splitlines()     # launch tags each rank's lines
    summary = json.loads([ln for ln in lines if ln.startswith("{")][-1])
    per_epoch = summary["steps"] // a.epochs * a.batch_size * a.np
    seconds = [e["epoch"] * per_epoch / e["samples_per_sec"] for e in epochs]
    reached = next((s for e, s in zip(epochs, seconds) if (e["accuracy"] or 0) >= a.target), None)
    return {"accuracy": [e["accuracy"] for e in epochs], "seconds": seconds, "to_target": reached,
            "final": epochs[-1]["accuracy"], "samples_per_sec": epochs[-1]["samples_per_sec"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", default="torch", choices=("torch", "tensorflow", "mxnet"))
    p.add_argument("-np", dest="np", type=int, default=2)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--augment", action="store_true", help="random crop and flip (default off: digits are not "
                                                          "mirror-symmetric)")
    p.add_argument("--target", type=float, default=0.95, help="held-out accuracy to reach (default 0.95)")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--write-docs", action="store_true")
    a = p.parse_args()
    precisions = a.precisions.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        images = digits_folder(Path(tmp) / "digits")
        runs: dict = {pr: [] for pr in precisions}
        for round_ in range(a.repeats):
            for pr in precisions:
                out = one_run(a, pr, images)
                runs[pr].append(out)
                print(f"round {round_ + 1} {pr}: {out}", file=sys.stderr, flush=True)
    lines, failed = [], False
    for pr in precisions:
        ok = [r for r in runs[pr] if "failed" not in r]
        failed |= len(ok) < len(runs[pr])
        if not ok:
            lines.append(f"| {pr} | failed: {runs[pr][-1]['failed']} | | | |")
            continue
        times = [r["to_target"] for r in ok]
        reached = [t for t in times if t is not None]
        median = f"{statistics.median(reached):.1f}" if len(reached) == len(times) else "not reached in every round"
        lines.append([pr, median, ", ".join("-" if t is None else f"{t:.1f}" for t in times),
                      f"{statistics.median(r['final'] for r in ok):.4f}",
                      f"{statistics.median(r['samples_per_sec'] for r in ok):,.0f}"])
    command = (f"`.venv/bin/python -m benchmarks.workload_bench --framework {a.framework} -np {a.np} --epochs {a.epochs} "
               f"--batch-size {a.batch_size} --lr {a.lr} --image-size {a.image_size} --target {a.target} "
               f"--repeats {a.repeats}{' --augment' if a.augment else ''} --write-docs`")
    text = (f"Made by {command} on {common.machine()}. {a.framework} ResNet-18 (the zoo's, weights=None) on the 1797 "
            f"digits as {a.image_size}x{a.image_size} PNGs (20% held out), {a.np} ranks, batch {a.batch_size} per "
            f"rank, lr {a.lr}, {a.epochs} epochs.\n\n"
            + common.table(["precision", f"time to {a.target:.0%} (s, median)", "rounds (s)", "final accuracy",
                            "samples/s (all ranks)"], lines))
    print(text)
    if a.write_docs:
        common.write_between("BENCHMARKS.md", "tta", text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
