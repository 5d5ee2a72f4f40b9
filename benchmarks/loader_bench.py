"""Sharded streams against image folders, per framework: the training loader alone (samples/s per
rank, no model) and ResNet-18's training fed from each, 2 ranks: the table behind docs/BENCHMARKS.md
("Sharded streams vs image folders"). The loader must not be the bottleneck: loader alone >= 3x the
training rate per rank.

    .venv/bin/python -m benchmarks.loader_bench --frameworks torch --rounds 1     # print only, ~3 min
    .venv/bin/python -m benchmarks.loader_bench --write-docs                      # all three, ~8 min (+1 the first time)

Two folders of 32x32 RGB PNGs in `--classes` class folders are made once under `--root` (a few
hundred images encoded once, their bytes copied to every name): `images` (`--files`, for the loader
alone) and `train-images` (`--train-files`, small enough that an epoch of ResNet-18 on 2 CPU ranks
takes well under a minute). Each is also written as each framework's shards (`toolkit shards
imagefolder:... OUT --framework F --shard-size N`: WebDataset tar, TFRecord, RecordIO).

- Loader alone: one `toolkit launch -np 2 --gloo` job per framework and source runs this module with
  `--worker`: every rank starts a session (`toolkit.start`, batch 32, image_size 32, augment on,
  `loader_workers` as given, 0 = read in the training process), builds the training loader of the
  source as the trainer does (`toolkit.data.datasets.datasets(config, session).train`, `session.loader`)
  and iterates whole epochs of it (decode + resize + augment + batch; MXNet's arrays waited for),
  each epoch timed from a barrier to its last batch. Both ranks load at once, so each rank's rate is
  measured while the other rank loads on the same host.
- Training: `examples/train.py --model resnet18 --image-size 32 --batch-size 32 --epochs 2` on the
  same source, 2 ranks; the second epoch's samples/s (from rank 0's cumulative per-epoch lines: the
  first epoch carries the model's first steps, tracing and allocation), divided by the 2 ranks (the
  trainer's rate is global: samples of all ranks per second).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT
FRAMEWORKS = ("torch", "tensorflow", "mxnet")
EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+) .* ([\d,]+) samples/s")


# -- the data --------------------------------------------------------------------------------------

def generate(root: Path, files: int, classes: int, side: int = 32, distinct: int = 200) -> Path:
    """`root/class<c>/<i>.png`, `files` in all (`distinct` encoded images copied to every name); kept
    when it already holds them (a marker file)."""
    done = root / f".complete-{files}-{classes}-{side}"
    if done.exists():
        return root
    import numpy as np
    from PIL import Image
    rng = np.random.RandomState(0)
    encoded = []
    for i in range(distinct):
        tint = rng.randint(0, 256, 3)
        pixels = np.clip(tint + rng.randint(-60, 60, (side, side, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    for i in range(files):
        folder = root / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i // classes:06d}.png").write_bytes(encoded[i % distinct])
    done.touch()
    return root


def write_shards(folder: Path, out: Path, framework: str, shard_size: int) -> Path:
    """`toolkit shards imagefolder:FOLDER OUT --framework F`, once (kept when its index is there)."""
    done = out / f".complete-{shard_size}"
    if done.exists() and (out / "index.json").exists():
        return out
    subprocess.run([sys.executable, "-m", "toolkit", "shards", f"imagefolder:{folder}", str(out), "--framework",
                    framework, "--shard-size", str(shard_size)], cwd=ROOT, check=True, capture_output=True)
    done.touch()
    return out


# -- the loader alone: one rank --------------------------------------------------------------------

def worker(a) -> int:
    """One rank: `a.rounds` timed epochs of the training loader of `a.source`; rank 0 writes every
    rank's rates to `a.result`."""
    import toolkit
    from toolkit.data.datasets import datasets

    session = toolkit.start(framework=a.worker, model="resnet18", dataset=a.source, batch_size=a.batch_size,
                            image_size=a.image_size, loader_workers=a.loader_workers, quiet=True)
    loader = session.loader(datasets(session.config, session).train)
    if a.worker == "mxnet":
        def ready(x):
            x.wait_to_read()
    else:
        def ready(x):
            pass
    rates = []
    for r in range(a.rounds):
        loader.set_epoch(r)
        session.mean(0.0, name=f"loader_bench.start{r}")       # both ranks start together
        t0, n = time.perf_counter(), 0
        for batch in loader:
            ready(batch[0])
            n += int(batch[0].shape[0])
        rates.append(n / (time.perf_counter() - t0))
        session.mean(0.0, name=f"loader_bench.end{r}")
    every = session.allgather_object(rates, name="loader_bench.rates")
    if session.rank == 0:
        Path(a.result).write_text(json.dumps({"rates": every, "samples": n}))
    return 0


def loader_alone(framework: str, source: str, a) -> dict:
    """{"rates": [[per round] per rank], "samples": per rank per epoch} of one `-np` job."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "toolkit", "launch", "-np", str(a.np), "--gloo", "--timeout", str(a.timeout),
                "--", sys.executable, "-m", "benchmarks.loader_bench", "--worker", framework, "--source", source,
                "--result", str(result), "--rounds", str(a.rounds), "--batch-size", str(a.batch_size),
                "--image-size", str(a.image_size), "--loader-workers", str(a.loader_workers)]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0 or not result.is_file():
            return {"failed": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
        return json.loads(result.read_text())


# -- training --------------------------------------------------------------------------------------

def training(framework: str, source: str, a) -> dict:
    """ResNet-18 on `source`, `-np` ranks, 2 epochs: the second epoch's samples/s per rank, and the
    summary's (global, both epochs)."""
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", str(a.np), "--gloo", "--timeout", str(a.timeout), "--",
            sys.executable, "examples/train.py", "--framework", framework, "--model", "resnet18", "--dataset", source,
            "--image-size", str(a.image_size), "--batch-size", str(a.batch_size), "--epochs", "2",
            "--loader-workers", str(a.loader_workers)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[0]<stdout>:")]      # rank 0's, launch's prefix
    try:
        summary = json.loads(lines[-1].split(":", 1)[1])
    except (IndexError, json.JSONDecodeError):
        return {"failed": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    # rank 0's per-epoch lines: the cumulative rate after epoch 1 and after epoch 2
    cumulative = {int(m.group(1)): float(m.group(3).replace(",", ""))
                  for m in map(EPOCH_LINE.search, proc.stderr.splitlines()) if m}
    steps = summary["steps"] // 2 if "steps" in summary else None
    per_epoch = (steps or 0) * a.batch_size * a.np
    if proc.returncode != 0 or set(cumulative) != {1, 2} or not per_epoch:
        return {"failed": f"rc {proc.returncode}, epoch lines {sorted(cumulative)}, summary keys {sorted(summary)[:8]}"}
    seconds1 = per_epoch / cumulative[1]
    seconds2 = 2 * per_epoch / cumulative[2] - seconds1
    return {"per_rank": per_epoch / seconds2 / a.np, "summary_per_rank": summary["samples_per_sec"] / a.np,
            "steps_per_epoch": steps}


# -- the table -------------------------------------------------------------------------------------

def command(a) -> str:
    return (f".venv/bin/python -m benchmarks.loader_bench --frameworks {a.frameworks} -np {a.np} --files {a.files} "
            f"--train-files {a.train_files} --shard-size {a.shard_size} --rounds {a.rounds} --train-rounds {a.train_rounds} "
            f"--loader-workers {a.loader_workers} --write-docs")


def report(results: dict, a, loads) -> str:
    rows = []
    for (fw, kind), r in results.items():
        if "failed" in r.get("loader", {}) or "failed" in r.get("training", {}):
            why = r["loader"].get("failed") or r["training"].get("failed")
            rows.append(f"| {fw} | {kind} | failed: {why} | | | |")
            continue
        per_rank = [statistics.median(rank) for rank in r["loader"]["rates"]]
        loader = statistics.median(per_rank)
        train = statistics.median(t["per_rank"] for t in r["training"]["rounds"])
        ratio = loader / train
        rows.append([fw, kind, f"{loader:,.0f} ({', '.join(f'{x:,.0f}' for x in per_rank)})", f"{train:,.1f}",
                     f"{ratio:.1f}x", "yes" if ratio >= 3 else "**no**"])
    return (f"Made by `{command(a)}` on {common.machine()}; no GPU, the {os.cpu_count()} cores shared by the "
            f"{a.np} ranks (Gloo); the host's 1-minute load average {min(loads):.1f} to {max(loads):.1f} over the "
            f"run (its own ranks and threads; read differences under ~20% as noise). Loader alone: the training loader (decode + resize to {a.image_size} + random "
            f"crop and flip + batch {a.batch_size}, `loader_workers` {a.loader_workers}: decoded in the rank's own "
            f"process) iterated with no model, {a.np} ranks loading at once, {a.files:,} PNGs "
            f"({int(a.files * 0.8):,} training samples, {int(a.files * 0.8) // a.np:,} per rank per epoch); median "
            f"of {a.rounds} epochs per rank, then over the ranks (each rank's in brackets). Training: "
            f"`examples/train.py --model resnet18 --image-size {a.image_size} --batch-size {a.batch_size} "
            f"--epochs 2` on {a.train_files:,} PNGs (the same kind of images), the second epoch's samples/s divided "
            f"by the {a.np} ranks (the trainer's rate counts all ranks' samples), median of {a.train_rounds} run(s). "
            f"Shards: `toolkit shards imagefolder:... OUT --framework F --shard-size {a.shard_size}`.\n\n"
            + common.table(["framework", "source", "loader alone, samples/s per rank", "training, samples/s per rank",
                            "loader / training", ">= 3x"], rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma separated (default: all three)")
    p.add_argument("-np", dest="np", type=int, default=2, help="ranks per job (default 2)")
    p.add_argument("--root", type=Path, default=Path("/tmp/loaderbench"), help="where the folders and shards are "
                   "made (once; default /tmp/loaderbench)")
    p.add_argument("--files", type=int, default=20_000, help="PNGs of the loader's folder (default 20000)")
    p.add_argument("--train-files", type=int, default=2_000, help="PNGs of the training folder (default 2000)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--shard-size", type=int, default=1000, help="samples per shard (default 1000)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--loader-workers", type=int, default=0, help="the config's loader_workers (default 0)")
    p.add_argument("--rounds", type=int, default=2, help="timed loader epochs per rank (default 2)")
    p.add_argument("--train-rounds", type=int, default=2, help="training runs per row, the median reported "
                   "(default 2; a run takes 30-120 s on 2 busy cores)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per job (default 600)")
    p.add_argument("--write-docs", action="store_true", help="also write the table into docs/BENCHMARKS.md")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--source", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    t0 = time.perf_counter()
    big = generate(a.root / "images", a.files, a.classes, a.image_size)
    small = generate(a.root / "train-images", a.train_files, a.classes, a.image_size)
    frameworks = a.frameworks.split(",")
    sources = {}
    for fw in frameworks:
        sources[(fw, "imagefolder")] = (f"imagefolder:{big}", f"imagefolder:{small}")
        sources[(fw, "shards")] = tuple(
            f"shards:{write_shards(folder, a.root / f'{name}-shards-{fw}', fw, a.shard_size)}"
            for folder, name in ((big, "images"), (small, "train-images")))
    print(f"data ready ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    results, loads = {}, []
    for key, (loading, train_source) in sources.items():
        t1 = time.perf_counter()
        loads.append(os.getloadavg()[0])
        r = results[key] = {"loader": loader_alone(key[0], loading, a), "training": {"rounds": []}}
        for _ in range(a.train_rounds):
            t = training(key[0], train_source, a)
            if "failed" in t:
                r["training"] = t
                break
            r["training"]["rounds"].append(t)
        print(f"{key[0]} {key[1]} ({time.perf_counter() - t1:.0f} s): {json.dumps(r)}", file=sys.stderr, flush=True)
    loads.append(os.getloadavg()[0])
    text = report(results, a, loads)
    print(text)
    print(f"({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr)
    if a.write_docs:
        common.write_between("BENCHMARKS.md", "loaders", text)
    return 1 if any("failed" in v for r in results.values() for v in r.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
