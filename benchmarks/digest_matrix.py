"""The redesign's proof: `param_digest` of a fixed matrix of real trainings, before and after a change.

    .venv/bin/python -m benchmarks.digest_matrix --save before.json            # record
    .venv/bin/python -m benchmarks.digest_matrix --compare before.json         # after: every row equal?
    .venv/bin/python -m benchmarks.digest_matrix --root /tmp/old --save before.json   # another checkout

Every row is `examples/train.py --epochs 2` on the built-in digits data, single-process or 2 ranks
launched by `toolkit launch` (horovodrun over Gloo; mpirun for the parameter server; TF_CONFIG workers
for TensorFlow's native strategy) or by torchrun (torch's native backend). `param_digest` is a sha256 of
every parameter's bytes, so two runs
agree only if every bit of every weight agrees. `--root` runs another checkout's train.py and toolkit
(its folder first on PYTHONPATH, `toolkit.adapters` linked to its adapters/) with this virtualenv.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TORCH, TF, MX = ("--framework", "torch"), ("--framework", "tensorflow"), ("--framework", "mxnet")
# (row, launcher, ranks, arguments after train.py); launcher: single | gloo | mpirun | native
MATRIX = [
    ("torch", "single", 1, TORCH),
    ("torch", "gloo", 2, TORCH),
    ("keras3 horovod", "single", 1, TF),
    ("keras3 horovod", "gloo", 2, TF),
    ("tf_keras horovod", "single", 1, (*TF, "--keras", "tf_keras")),
    ("tf_keras horovod", "gloo", 2, (*TF, "--keras", "tf_keras")),
    ("tensorflow native mirrored", "single", 1, (*TF, "--backend", "native", "--strategy", "mirrored")),
    ("tensorflow native multi_worker_mirrored", "native", 2, (*TF, "--backend", "native")),
    ("mxnet", "single", 1, MX),
    ("mxnet", "gloo", 2, MX),
    ("torch accumulation 2", "gloo", 2, (*TORCH, "--accumulation-steps", "2")),
    ("torch precision bf16", "gloo", 2, (*TORCH, "--precision", "bf16")),
    ("torch compression topk", "gloo", 2, (*TORCH, "--compression", "topk")),
    ("torch compression powersgd", "gloo", 2, (*TORCH, "--compression", "powersgd")),
    ("torch local_sgd", "gloo", 2, (*TORCH, "--sync", "local_sgd")),
    ("torch parameter server ssp 0, 1 worker", "mpirun", 2,
     (*TORCH, "--sync", "ssp", "--staleness", "0", "--ps-servers", "1")),
    ("keras3 precision fp16", "gloo", 2, (*TF, "--precision", "fp16")),
    ("mxnet accumulation 2", "gloo", 2, (*MX, "--accumulation-steps", "2")),
    # torch's own engine (torchrun, DDP): each row is the twin of the Horovod row of the same name (equal
    # digests) but PowerSGD, which is DDP's own powerSGD_hook here (adapters/torch/comm_hooks.py)
    ("torch native", "torchrun", 1, (*TORCH, "--backend", "native")),
    ("torch native", "torchrun", 2, (*TORCH, "--backend", "native")),
    ("torch native accumulation 2", "torchrun", 2, (*TORCH, "--backend", "native", "--accumulation-steps", "2")),
    ("torch native precision bf16", "torchrun", 2, (*TORCH, "--backend", "native", "--precision", "bf16")),
    ("torch native compression topk", "torchrun", 2, (*TORCH, "--backend", "native", "--compression", "topk")),
    ("torch native compression powersgd", "torchrun", 2,
     (*TORCH, "--backend", "native", "--compression", "powersgd")),
    ("torch native local_sgd", "torchrun", 2, (*TORCH, "--backend", "native", "--sync", "local_sgd")),
    ("torch clip 0.5", "gloo", 2, (*TORCH, "--clip-grad-norm", "0.5")),
    ("torch native clip 0.5", "torchrun", 2, (*TORCH, "--backend", "native", "--clip-grad-norm", "0.5")),
    ("torch precision fp16", "gloo", 2, (*TORCH, "--precision", "fp16")),
    ("torch native precision fp16", "torchrun", 2, (*TORCH, "--backend", "native", "--precision", "fp16")),
    # the toolkit's compressed allreduce (an alltoall, a reduce, an allgather) runs from 3 ranks on
    ("torch compression int8", "gloo", 3, (*TORCH, "--compression", "int8")),
    ("torch native compression int8", "torchrun", 3, (*TORCH, "--backend", "native", "--compression", "int8")),
    ("mxnet compression int8", "gloo", 3, (*MX, "--compression", "int8")),
]


def argv(root: Path, launcher: str, ranks: int, args) -> list[str]:
    train = [sys.executable, str(root / "examples" / "train.py"), "--dataset", "digits", "--epochs", "2", *args]
    if launcher == "single":
        return train
    launch = [sys.executable, "-m", "toolkit", "launch", "-np", str(ranks), "--timeout", "300"]
    if launcher == "gloo":
        return [*launch, "--gloo", "--", *train]
    if launcher == "mpirun":
        return [*launch, "--launcher", "mpirun", "--", *train]
    if launcher == "torchrun":     # torch's own launcher, as a user of backend native starts it
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *train[1:]]
    return [*launch, "--framework", "tensorflow", "--backend", "native", "--", *train]


def environment(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLKIT_", "HOROVOD_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if root != ROOT:
        link = root / "toolkit" / "adapters"
        if not link.exists():
            link.symlink_to(root / "adapters")
        env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def digest(root: Path, launcher: str, ranks: int, args) -> tuple[str, str, float]:
    """(param_digest, the summary's path, seconds) of one row."""
    t0 = time.monotonic()
    proc = subprocess.run(argv(root, launcher, ranks, args), capture_output=True, text=True, timeout=400,
                          env=environment(root), cwd=root)
    lines = [ln for ln in re.sub(r"\[[\d,]+\]<stdout>:", "", proc.stdout).splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or len(lines) != 1:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return f"FAILED (exit {proc.returncode}: {tail[:120]})", "", time.monotonic() - t0
    out = json.loads(lines[0])
    return out["param_digest"], out["path"], time.monotonic() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose train.py and toolkit run")
    p.add_argument("--save", type=Path, help="write {row: digest} as JSON")
    p.add_argument("--compare", type=Path, help="a saved JSON: print it beside this run, exit 1 on a difference")
    p.add_argument("--only", nargs="*", default=(), help="rows whose name starts with one of these")
    a = p.parse_args()
    before = json.loads(a.compare.read_text()) if a.compare else {}
    results, differ = {}, []
    print("| row | ranks | " + ("before | after | equal |" if before else "param_digest |") + " path | seconds |")
    print("|---|---|" + ("---|---|---|" if before else "---|") + "---|---|")
    for name, launcher, ranks, args in MATRIX:
        if a.only and not name.startswith(tuple(a.only)):
            continue
        key = f"{name} x{ranks}"
        value, path, seconds = digest(a.root.resolve(), launcher, ranks, args)
        results[key] = value
        if before:
            equal = before.get(key) == value and not value.startswith("FAILED")
            differ += [] if equal else [key]
            print(f"| {name} | {ranks} | {before.get(key, '-')} | {value} | {'yes' if equal else 'NO'} | {path} | {seconds:.0f} |",
                  flush=True)
        else:
            print(f"| {name} | {ranks} | {value} | {path} | {seconds:.0f} |", flush=True)
    if a.save:
        a.save.write_text(json.dumps(results, indent=1) + "\n")
    if differ:
        print(f"different: {', '.join(differ)}", file=sys.stderr)
    return 1 if differ or any(v.startswith("FAILED") for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
