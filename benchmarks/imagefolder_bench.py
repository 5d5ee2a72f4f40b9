"""Time to the first step on an image folder of 200,000 small files: the code of a git commit (the
"before", checked out in a worktree) against the working tree's, per framework: the table behind
docs/BENCHMARKS.md ("Image folders at scale").

    .venv/bin/python -m benchmarks.imagefolder_bench --before COMMIT --rounds 3              # print only
    .venv/bin/python -m benchmarks.imagefolder_bench --before COMMIT --rounds 3 --write-docs

The folder (`--root`, made once and reused: `--classes` class folders of `--files` / `--classes`
32x32 RGB PNGs, a few hundred encoded images copied to every name) is read as `imagefolder:ROOT`
by a real `toolkit launch -np 2` job of examples/train.py (ResNet-18, --image-size 32). The time is
from the launch to rank 0's `... steps/epoch ...` line, which the trainer prints once the datasets
are read and the loaders made, just before the first step; the job's processes are then killed.
Warm: every file read once before the rounds. `--cold` also drops the page cache before each launch
(root only): the time a folder not read since the machine started sees.
"""
from __future__ import annotations

import argparse
import io
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT
READY = "steps/epoch"      # rank 0's line before the first step (toolkit/run/trainer.py)


def generate(root: Path, files: int, classes: int, side: int = 32) -> Path:
    """`root/<class>/<i>.png`, `files` in all; kept when it already holds them (a marker file)."""
    done = root / f".complete-{files}-{classes}-{side}"
    if done.exists():
        return root
    import numpy as np
    from PIL import Image
    rng = np.random.RandomState(0)
    per = files // classes
    for c in range(classes):
        tint = rng.randint(0, 256, 3)
        encoded = []
        for _ in range(32):         # distinct images per class, copied to every name: writing is the cost
            pixels = np.clip(tint + rng.randint(-60, 60, (side, side, 3)), 0, 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
            encoded.append(buffer.getvalue())
        folder = root / f"class{c:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per):
            (folder / f"{i:06d}.png").write_bytes(encoded[i % len(encoded)])
    done.touch()
    return root


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def warm(root: Path) -> None:
    """Every file read once, so a warm round does not pay for the folder's first read."""
    for folder in os.scandir(root):
        if folder.is_dir():
            for entry in os.scandir(folder.path):
                with open(entry.path, "rb") as f:
                    f.read()


def time_to_first_step(code: Path, framework: str, root: Path, timeout: float) -> float:
    """Seconds from launching the job (with `code`'s toolkit on the path) to rank 0's READY line."""
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "toolkit", "launch", "-np", "2", "--gloo", "--", sys.executable,
               "examples/train.py", "--framework", framework,
               "--model", "resnet18", "--dataset", f"imagefolder:{root}", "--image-size", "32", "--batch-size", "32",
               "--epochs", "1", "--no-augment"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if READY in line:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                break
        raise SystemExit(f"{framework} ({code}): no '{READY}' line:\n{''.join(lines[-30:])}")
    finally:
        for pid in [proc.pid, *descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def descendants(pid: int) -> list[int]:
    """Every process under `pid`: horovodrun and each rank run in sessions of their own, so killing
    the launch's process group leaves them running (and a rank handles SIGTERM as a preemption)."""
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [c for c, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("/tmp/imagefolder-200k"))
    p.add_argument("--files", type=int, default=200_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--before", default="HEAD~1", help="git commit of the 'before' code (a worktree in /tmp)")
    p.add_argument("--frameworks", default="torch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="drop the page cache before each launch (root)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--generate-only", action="store_true")
    p.add_argument("--write-docs", action="store_true")
    a = p.parse_args()
    t0 = time.perf_counter()
    generate(a.root, a.files, a.classes)
    print(f"folder {a.root}: {a.files} files ({time.perf_counter() - t0:.0f} s to make or find)", flush=True)
    if a.generate_only:
        return
    with common.before_and_after(a.before, Path("/tmp/imagefolder-bench-before")) as codes:
        caches = ["cold", "warm"] if a.cold else ["warm"]
        results = {}
        for framework in a.frameworks.split(","):
            for cache in caches:
                if cache == "warm":
                    warm(a.root)
                for r in range(a.rounds):
                    for name in (("before", "after") if r % 2 == 0 else ("after", "before")):    # ABBA
                        if cache == "cold" and not drop_caches():
                            raise SystemExit("--cold: cannot write /proc/sys/vm/drop_caches (run as root)")
                        seconds = time_to_first_step(codes[name], framework, a.root, a.timeout)
                        results.setdefault((framework, cache, name), []).append(seconds)
                        print(f"{framework} {cache} {name} round {r}: {seconds:.1f} s", flush=True)
    rows = []
    for framework in a.frameworks.split(","):
        for cache in caches:
            before = statistics.median(results[(framework, cache, "before")])
            after = statistics.median(results[(framework, cache, "after")])
            rows.append((framework, cache, f"{before:.1f}", f"{after:.1f}", f"{before / after:.2f}x"))
    text = (f"Made by `.venv/bin/python -m benchmarks.imagefolder_bench --before {a.before} --frameworks "
            f"{a.frameworks} --rounds {a.rounds}{' --cold' if a.cold else ''} --write-docs` on {common.today()}, "
            f"{common.cores()}, 2 ranks (Gloo); `imagefolder:` of {a.files:,} 32x32 PNGs in {a.classes} class "
            f"folders; seconds from `toolkit launch` to rank 0's `{READY}` line (just before the first step), "
            f"median of {a.rounds}. before: {a.before}'s code; after: the working tree's.\n\n"
            + common.table(("framework", "page cache", "before (s)", "after (s)", "before / after"), rows))
    print(text)
    if a.write_docs:
        common.write_between(common.DOCS / "BENCHMARKS.md", "imagefolder", text)


if __name__ == "__main__":
    main()
