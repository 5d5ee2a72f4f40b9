"""How long a checkpoint stops training, synchronous against `checkpoint_async`, for each `checkpoint_format`: the
table behind docs/CHECKPOINTS.md's `<!-- async:begin -->` block.

    .venv/bin/python -m benchmarks.checkpoint_bench                 # ~5 min on 2 cores: print only
    .venv/bin/python -m benchmarks.checkpoint_bench --write-docs

One process, torch on the native backend (a torch.distributed group of one rank: a sharded checkpoint is written
by DCP's `save` and `async_save`, as on every rank of a larger job; `--backend horovod`: rank 0 writes it whole), an
MLP of `--mb` MiB of float32 weights with SGD's momentum (the checkpoint is twice that), trained on one fixed batch;
checkpoints into the system's temporary folder (this machine's disk). A round, rows alternating (ABBA): the steps
alone (the step time), a synchronous save (its stall: the save() call), an asynchronous save and the steps that run
while it writes (its stall: the save() call plus what those steps took beyond the step time, since the writer shares
the cores). Medians of the rounds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from benchmarks import common


def measure(sessions, step, rounds: int, threads: int, form: str) -> list[list[str]]:
    """The four rows of one checkpoint format at one setting of torch's training threads; `sessions` and `step`
    keyed "sync" and "async"."""
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
                s.checkpoints.finish()
    t_step = statistics.median(step_s)
    stalls = [call + max(0.0, spent - steps * t_step) for call, spent, steps in async_s]
    sync, stall, call = statistics.median(sync_s), statistics.median(stalls), statistics.median(async_call_s)
    during = statistics.median([steps for _, _, steps in async_s])
    return [[threads, form, "steps alone", f"{t_step * 1000:.1f} a step", "", ""],
            [threads, form, "synchronous save", f"{sync * 1000:.0f}", "1.00", ""],
            [threads, form, "checkpoint_async: the save() call", f"{call * 1000:.0f}", f"{call / sync:.2f}", ""],
            [threads, form, "checkpoint_async: the call + what the steps lost during the write",
             f"{stall * 1000:.0f}", f"{stall / sync:.2f}", f"{during:.0f}"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=128, help="MiB of weights (default 128: 32M float32 values)")
    p.add_argument("--rounds", type=int, default=6, help="rounds, each row once a round (default 6)")
    p.add_argument("--threads", default="0,1", help="torch's threads for training, one table part each (default "
                                                  "0,1: every core, then 1, which leaves a core to the writer as a GPU "
                                                  "job's host has cores to spare)")
    p.add_argument("--formats", default="single,sharded", help="checkpoint_format values, one table part each "
                   "(default single,sharded)")
    p.add_argument("--backend", default="native", choices=["native", "horovod"], help="the engine (default native: "
                   "sharded checkpoints through DCP on every rank)")
    p.add_argument("--write-docs", action="store_true", help="write the table into docs/CHECKPOINTS.md")
    args = p.parse_args()

    import torch

    import toolkit
    width = 2048
    layers = max(1, args.mb * (1 << 20) // 4 // (width * width))
    forms = args.formats.split(",")
    keys = [(form, mode) for form in forms for mode in ("sync", "async")]
    folders = {key: tempfile.mkdtemp(prefix=f"ckpt-bench-{key[0]}-{key[1]}-") for key in keys}
    sessions = {}
    for key, folder in folders.items():
        s = toolkit.start(framework="torch", backend=args.backend, checkpoint_dir=folder, checkpoint_format=key[0],
                          checkpoint_async=key[1] == "async", keep_checkpoints=2, quiet=True, lr=1e-6)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
        model, opt = s.setup(model, torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9))
        sessions[key] = (s, model)
    import os
    cores = os.cpu_count() or 1
    threads_list = [int(t) for t in args.threads.split(",")]
    x = torch.randn(16, width)

    def step(key):
        s, model = sessions[key]
        s.backward(model(x).square().mean())
        s.step()

    for key in sessions:          # warm: the first steps and saves (allocators, the first collectives)
        for _ in range(3):
            step(key)
        sessions[key][0].save()
        sessions[key][0].checkpoints.finish()
    rows = []
    for threads in threads_list:
        torch.set_num_threads(threads or cores)
        for form in forms:
            rows += measure({mode: sessions[form, mode] for mode in ("sync", "async")},
                            lambda mode, form=form: step((form, mode)), args.rounds, threads or cores, form)
    size = sum(v.numel() for v in sessions[keys[0]][1].parameters()) * 4 / (1 << 20)
    text = common.table(["training threads", "checkpoint_format", "row", "ms (median)", "vs synchronous",
                         "steps during the write"], rows)
    print(text)
    for s, _ in sessions.values():
        s.close()
    import shutil
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)
    if args.write_docs:
        common.write_between("CHECKPOINTS.md", "async",
                             f"Made by `.venv/bin/python -m benchmarks.checkpoint_bench --mb {args.mb} --rounds "
                             f"{args.rounds} --threads {args.threads} --formats {args.formats} --backend "
                             f"{args.backend} --write-docs` on {common.machine()}: torch on the {args.backend} backend, "
                             f"one rank, {size:.0f} MiB of weights + SGD momentum, {args.rounds} rounds.\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
