"""The toolkit's own cost per optimizer step (torch), measured in one process where it can be resolved.

    .venv/bin/python -m benchmarks.step_overhead [--sizes 64x1,2048x3] [--blocks 15]

On 2 shared cores two launched jobs differ by 10-15% from run to run, so a 1% budget cannot be
checked end to end. Here one process (Horovod on one rank, the same `hvd.DistributedOptimizer`)
holds one model and times, in alternating blocks, (a) the toolkit's step (`session.train_step` on
batches already on the device, loss read back each step) and (b) the plain Horovod step
(`zero_grad`, forward, `backward`, `step` on torch tensors), so machine drift hits both alike.
Reports the median block time per step of each and the difference, in microseconds and as a share
of the step; the tiny model shows the overhead alone, the 10M model shows it against real work.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import common


def measure(hidden_size: int, hidden_layers: int, features: int, blocks: int, steps: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import toolkit

    session = toolkit.start({}, hidden_size=hidden_size, hidden_layers=hidden_layers, framework="torch")
    model, optimizer = session.setup(session.builtin_model(features, 10))
    rng = np.random.RandomState(0)
    n = session.config.batch_size
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = rng.randint(0, 10, n).astype(np.int64)
    batches = next(session.loader((x, y), shuffle=False).steps())     # on the device, as the trainer's are
    xt, yt = batches[0]

    def plain():
        optimizer.zero_grad()
        F.cross_entropy(model(xt), yt).backward()
        optimizer.step()

    def toolkit_step():
        float(session.train_step(batches))      # the trainer reads the loss once an epoch; here every step

    times = {"toolkit": [], "plain": []}
    for name, fn in (("toolkit", toolkit_step), ("plain", plain)):
        for _ in range(max(3, steps // 5)):      # warm-up both
            fn()
    for _ in range(blocks):
        for name, fn in (("toolkit", toolkit_step), ("plain", plain)):
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            times[name].append((time.perf_counter() - t0) / steps)
    params = sum(p.numel() for p in model.parameters())
    out = {name: statistics.median(v) for name, v in times.items()}
    return {"model": f"{features} -> {hidden_layers} x {hidden_size} -> 10", "parameters": params,
            "threads": torch.get_num_threads(), **out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64x1,2048x3", help="hidden_size x hidden_layers, comma separated")
    p.add_argument("--features", type=int, default=1024, help="MLP input width (default 1024)")
    p.add_argument("--blocks", type=int, default=15, help="alternating blocks per path")
    args = p.parse_args()
    rows = []
    for item in args.sizes.split(","):
        size, layers = (int(v) for v in item.split("x"))
        steps = 200 if size * size * layers < 1e6 else 5
        rows.append(measure(size, layers, args.features, args.blocks, steps))
    cells = [[r["model"], f"{r['parameters']:,}", f"{r['plain'] * 1e3:.3f} ms", f"{r['toolkit'] * 1e3:.3f} ms",
              f"{(r['toolkit'] - r['plain']) * 1e6:+.0f} us", f"{100 * (r['toolkit'] - r['plain']) / r['plain']:+.2f}%"]
             for r in rows]
    print(common.table(["model", "parameters", "plain Horovod step", "toolkit step", "toolkit - plain",
                        "share of the step"], cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
