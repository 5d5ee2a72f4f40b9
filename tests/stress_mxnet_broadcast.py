"""Reproduce (or rule out) the Horovod/MXNet crash that toolkit/install/horovod.py's `mxnet-enqueue-name`
row patches: many tiny in-place broadcasts in one process while `yes` processes load every core.

    .venv/bin/python tests/stress_mxnet_broadcast.py --rounds 6 --seconds 50

Each round is a fresh process (Horovod at size 1: no launcher needed); the table says how many
broadcasts it queued and how it ended. Unpatched Horovod 0.28.1 ended one round of three with
`Segmentation fault: 11` here (2 cores, 4 `yes`); docs/TOOLCHAINS.md has the runs.
"""
from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys

ROUND = """
import sys, time
import mxnet as mx
import horovod.mxnet as hvd
hvd.init()
a, n, t0 = mx.nd.array([1.0, 2.0]), 0, time.time()
while time.time() - t0 < float(sys.argv[1]):
    for k in range(50):
        hvd.broadcast_(a, 0, name=f"x{k}")
    mx.nd.waitall()
    n += 50
print(n)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=50.0, help="broadcasting time per round")
    p.add_argument("--hogs", type=int, default=2 * multiprocessing.cpu_count(), help="`yes > /dev/null` processes beside it")
    args = p.parse_args()
    print(f"{'round':>5}  {'broadcasts':>10}  {'exit':>4}  ended")
    crashed = 0
    for r in range(1, args.rounds + 1):
        # `yes`, not Python loops: with its steady system calls the crash showed (1 round of 3), without not
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.hogs)]
        proc = subprocess.run([sys.executable, "-c", ROUND, str(args.seconds)], capture_output=True, text=True,
                              timeout=args.seconds + 120)
        for h in hogs:
            h.kill()
            h.wait()
        lines = proc.stdout.split()
        errors = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in errors if "Segmentation fault" in ln), errors[-1][:60] if errors else "?")
        crashed += proc.returncode != 0
        print(f"{r:>5}  {lines[-1] if proc.returncode == 0 and lines else '-':>10}  {proc.returncode:>4}  "
              f"{'ok' if proc.returncode == 0 else why}")
    print(f"{crashed} of {args.rounds} rounds crashed")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
