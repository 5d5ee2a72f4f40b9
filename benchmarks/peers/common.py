"""Shared by the peer scripts only (no toolkit code): arguments, the timing loop, the result file.

The loop is Horovod's synthetic benchmark's: warm-up steps, then `--iters` timed iterations of
`--steps-per-iter` optimizer steps on one fixed random batch; samples/sec per iteration.
Rank 0 writes {"rates": [[samples/s per iteration] per worker]} to --result, the shape
`toolkit bench` writes, so one summary reads both.
"""
import argparse
import json
import os
import time


def arguments(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="mlp", help="mlp, or a ResNet by its zoo name: resnet18, resnet50")
    p.add_argument("--image-size", type=int, default=224, help="ResNets: the side of the random images")
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--hidden-layers", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--hook", choices=("fp16", "bf16", "powersgd1", "powersgd2", "powersgd4"),
                   help="DDP only: its communication hook (default: none)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--steps-per-iter", type=int, default=10)
    p.add_argument("--result", default=None, help="rank 0 writes the rates here as JSON")
    return p.parse_args()


def threads(local_size: int) -> int:
    """The host's cores shared between its ranks (what every peer row uses, the toolkit too)."""
    return max(1, (os.cpu_count() or 1) // local_size)


def time_steps(args, step) -> list[float]:
    """Samples/sec of each timed iteration; `step()` must return only when the step is done."""
    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        for _ in range(args.steps_per_iter):
            step()
        rates.append(args.batch_size * args.steps_per_iter / (time.perf_counter() - t0))
    return rates


def write(args, all_rates: list) -> None:
    if args.result:
        with open(args.result, "w") as f:
            json.dump({"rates": [list(map(float, r)) for r in all_rates]}, f)
    flat = [r for w in all_rates for r in w]
    print(f"samples/sec per worker: {sum(flat) / len(flat):.1f}, total: "
          f"{sum(sum(w) / len(w) for w in all_rates):.1f} on {len(all_rates)} workers", flush=True)
