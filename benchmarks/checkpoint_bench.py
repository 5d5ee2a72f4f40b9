"""How long a checkpoint stops training, synchronous against `checkpoint_async`: the table behind
docs/CHECKPOINTS.md's `<!-- async:begin -->` block.

    .venv/bin/python -m benchmarks.checkpoint_bench                 # ~2 min on 2 cores: print only
    .venv/bin/python -m benchmarks.checkpoint_bench --write-docs

One process, torch on Horovod (one rank), an MLP of `--mb` MiB of float32 weights with SGD's momentum (the
checkpoint is twice that), trained on one fixed batch; checkpoints into the system's temporary folder (this
machine's disk). A round, rows alternating (ABBA): the steps alone (the step time), a synchronous save (its stall: the
save() call), an asynchronous save and the steps that run while its thread writes (its stall: the save() call
plus what those steps took beyond the step time, since the writer shares the cores). Medians of the rounds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from benchmarks import common


def measure(sessions, step, rounds: int, threads: int) -> list[list[str]]:
    """The four rows at one setting of torch's training threads."""
    step_s, sync_s, async_call_s, async_s = [], [], [], []
    for r in range(rounds):
        for row in (["steps", "sync", "async"] if r % 2 == 0 else ["async", "sync", "steps"]):
            if row == "steps":
                t0 = time.perf_counter()
                for _ in range(5):
                    step("sync")
                step_s.append((time.perf_counter() - t0) / 5)
            elif row == "sync":
                t0 = time.perf_counter()
                sessions["sync"][0].save()
                sync_s.append(time.perf_counter() - t0)
            else:
                s = sessions["async"][0]
                t0 = time.perf_counter()
                s.save()
                call = time.perf_counter() - t0
                steps, t1 = 0, time.perf_counter()
                while s.checkpoints.background.busy:
                    step("async")
                    steps += 1
                async_call_s.append(call)
                async_s.append((call, time.perf_counter() - t1, steps))
                s.checkpoints.background.wait()
    t_step = statistics.median(step_s)
    stalls = [call + max(0.0, spent - steps * t_step) for call, spent, steps in async_s]
    sync, stall, call = statistics.median(sync_s), statistics.median(stalls), statistics.median(async_call_s)
    during = statistics.median([steps for _, _, steps in async_s])
    return [[threads, "steps alone", f"{t_step * 1000:.1f} a step", "", ""],
            [threads, "synchronous save", f"{sync * 1000:.0f}", "1.00", ""],
            [threads, "checkpoint_async: the save() call", f"{call * 1000:.0f}", f"{call / sync:.2f}", ""],
            [threads, "checkpoint_async: the call + what the steps lost during the write", f"{stall * 1000:.0f}",
             f"{stall / sync:.2f}", f"{during:.0f}"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=128, help="MiB of weights (default 128: 32M float32 values)")
    p.add_argument("--rounds", type=int, default=6, help="rounds, each row once a round (default 6)")
    p.add_argument("--threads", default="0,1", help="torch's threads for training, one table part each (default "
                                                  "0,1: every core, then 1, which leaves a core to the writer as a GPU "
                                                  "job's host has cores to spare)")
    p.add_argument("--write-docs", action="store_true", help="write the table into docs/CHECKPOINTS.md")
    args = p.parse_args()

    import torch

    import toolkit
    width = 2048
    layers = max(1, args.mb * (1 << 20) // 4 // (width * width))
    folders = {name: tempfile.mkdtemp(prefix=f"ckpt-bench-{name}-") for name in ("sync", "async")}
    sessions = {}
    for name, folder in folders.items():
        s = toolkit.start(framework="torch", checkpoint_dir=folder, checkpoint_async=name == "async",
                          keep_checkpoints=2, quiet=True, lr=1e-6)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
        model, opt = s.setup(model, torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9))
        sessions[name] = (s, model)
    import os
    cores = os.cpu_count() or 1
    threads_list = [int(t) for t in args.threads.split(",")]
    x = torch.randn(16, width)

    def step(name):
        s, model = sessions[name]
        s.backward(model(x).square().mean())
        s.step()

    for name in sessions:          # warm: the first steps and saves (allocators, Horovod's first cycles)
        for _ in range(3):
            step(name)
        sessions[name][0].save()
        sessions[name][0].checkpoints.background.wait()
    rows = []
    for threads in threads_list:
        torch.set_num_threads(threads or cores)
        rows += measure(sessions, step, args.rounds, threads or cores)
    size = sum(v.numel() for v in sessions["sync"][1].parameters()) * 4 / (1 << 20)
    text = common.table(["training threads", "row", "ms (median)", "vs synchronous", "steps during the write"], rows)
    print(text)
    for s, _ in sessions.values():
        s.close()
    import shutil
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)
    if args.write_docs:
        common.write_between("CHECKPOINTS.md", "async",
                             f"Made by `.venv/bin/python -m benchmarks.checkpoint_bench --mb {args.mb} --rounds "
                             f"{args.rounds} --threads {args.threads} --write-docs` on {common.machine()}: torch, one "
                             f"rank, {size:.0f} MiB of weights + SGD momentum, {args.rounds} rounds.\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
