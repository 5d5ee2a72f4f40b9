"""A 2-rank, 1-epoch digits job per framework, launched as a user launches it, with the toolkit of a commit
("before", checked out in a worktree) against the working tree's: wall seconds of the whole job (start-up,
the epoch, exit) and the CPU seconds of every process under it (user + system), ABBA rounds, medians.

    .venv/bin/python -m benchmarks.startup_bench --before COMMIT --rounds 5               # print only
    .venv/bin/python -m benchmarks.startup_bench --before COMMIT --rounds 5 --write-docs  # docs/BENCHMARKS.md

A job this small is mostly start-up (imports, Horovod's init, the model's setup), which is what most of
the test suite's jobs are too.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT


def one_job(code: Path, framework: str, timeout: float) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process it ran) of one job with `code`'s toolkit on the path."""
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "toolkit", "launch", "-np", "2", "--gloo", "--", sys.executable,
               "examples/train.py", "--framework", framework, "--dataset", "digits", "--epochs", "1", "--quiet"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{framework} ({code}): exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="HEAD~1", help="git commit of the 'before' code (a worktree in /tmp)")
    p.add_argument("--frameworks", default="torch,tensorflow,mxnet")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--write-docs", action="store_true")
    a = p.parse_args()
    frameworks = a.frameworks.split(",")
    results: dict = {}
    with common.before_and_after(a.before, Path("/tmp/startup-bench-before")) as codes:
        for framework in frameworks:
            for code in codes.values():      # once untimed each: the page cache, bytecode
                one_job(code, framework, a.timeout)
            for r in range(a.rounds):
                for name in (("before", "after") if r % 2 == 0 else ("after", "before")):    # ABBA
                    wall, cpu = one_job(codes[name], framework, a.timeout)
                    results.setdefault((framework, name), []).append((wall, cpu))
                    print(f"{framework} {name} round {r}: {wall:.2f} s, {cpu:.2f} CPU s", flush=True)
    rows = []
    for framework in frameworks:
        b = [statistics.median(x[i] for x in results[(framework, "before")]) for i in (0, 1)]
        w = [statistics.median(x[i] for x in results[(framework, "after")]) for i in (0, 1)]
        rows.append((framework, f"{b[0]:.2f}", f"{w[0]:.2f}", f"{w[0] / b[0]:.2f}x", f"{b[1]:.2f}", f"{w[1]:.2f}",
                     f"{w[1] / b[1]:.2f}x"))
    text = (f"Made by `.venv/bin/python -m benchmarks.startup_bench --before {a.before} --frameworks {a.frameworks} "
            f"--rounds {a.rounds} --write-docs` on {common.machine()}: `toolkit launch -np 2 --gloo` "
            f"of examples/train.py, digits, 1 epoch; medians of {a.rounds} ABBA rounds. before: {a.before}'s code; "
            "after: the working tree's. CPU: user + system seconds of every process of the job.\n\n"
            + common.table(("framework", "wall before (s)", "wall after (s)", "after / before", "CPU before (s)",
                            "CPU after (s)", "after / before"), rows))
    print(text)
    if a.write_docs:
        common.write_between(common.DOCS / "BENCHMARKS.md", "startup", text)


if __name__ == "__main__":
    main()
