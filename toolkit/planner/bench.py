"""`toolkit bench`: the synthetic benchmark, in the manner of Horovod's own
(`pytorch_synthetic_benchmark.py`): warm-up steps, then timed iterations of several steps each;
samples/sec per worker (mean, +-1.96 std over iterations and workers), total, and scaling
efficiency against the smallest world size, for a list of world sizes.

Two halves. `measure()` runs on every rank of one launched job: the same session the trainer
uses (`toolkit.start`, `setup` of the built-in MLP, `train_step`), so the benchmark times the
toolkit's real step, on one fixed random batch already on the device (no data loading, as in
Horovod's script); each timed iteration ends by reading the loss back, so queued device work counts. `run()` is the parent: it launches
one job per world size through toolkit.launch.launcher, reads each job's result file, prints the table and
writes `bench.json` and `bench.png` (matplotlib, imported only there).

A result file is `{"rates": [[samples/s of each timed iteration] per worker], ...}`; the peer
scripts in benchmarks/peers/ write the same shape, so `summarize()` reads both.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.config import Config
from toolkit.errors import ToolkitError
from toolkit.launch import launcher as launch


@dataclass(frozen=True)
class Options:
    features: int = 1024        # input width of the synthetic batch
    classes: int = 10
    warmup: int = 10            # untimed steps first (graph tracing, allocator, Horovod's first cycles)
    iters: int = 10             # timed iterations ...
    steps_per_iter: int = 10    # ... of this many optimizer steps each

    def __post_init__(self):
        for name in ("features", "classes", "iters", "steps_per_iter"):
            if getattr(self, name) < 1:
                raise ToolkitError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if self.warmup < 0:
            raise ToolkitError(f"--warmup {self.warmup}: must be 0 or more")


def parse_np(text: str) -> list[int]:
    """"1,2,4" -> [1, 2, 4]: distinct, ascending, each at least 1."""
    try:
        sizes = sorted({int(item) for item in text.split(",") if item.strip()})
    except ValueError:
        raise ToolkitError(f"--np {text!r}: expected world sizes separated by commas, e.g. --np 1,2") from None
    if not sizes or sizes[0] < 1:
        raise ToolkitError(f"--np {text!r}: world sizes must be at least 1, e.g. --np 1,2")
    return sizes


# -- on every rank -------------------------------------------------------------------------------

def measure(config: Config, options: Options) -> dict | None:
    """Time the toolkit's step on this rank; rank 0 returns every worker's rates, the others None."""
    import numpy as np

    from toolkit.data.datasets import random_batch
    from toolkit.run import pipeline as run

    session = run.start(config)
    rng = np.random.RandomState(config.seed)
    n = config.batch_size * config.accumulation_steps * session.world_size      # one step of every replica
    data, features, classes, shape = random_batch(config, n, options.features, options.classes, rng)
    with session.scope():
        model = session.builtin_model(features, classes, shape)
    session.setup(model)
    batches = next(session.loader(data, shuffle=False).steps())      # on the device, reused every step
    samples = config.batch_size * config.accumulation_steps * options.steps_per_iter   # per replica
    for _ in range(options.warmup):
        loss = session.train_step(batches)
    session.to_float(loss)
    rates = []
    for _ in range(options.iters):
        t0 = time.perf_counter()
        for _ in range(options.steps_per_iter):
            loss = session.train_step(batches)
        session.to_float(loss)                  # the last step has finished
        rates.append(samples / (time.perf_counter() - t0))
    per_rank = session.allgather_object([rates] * session.replicas, name="toolkit.planner.bench.rates")
    if session.rank != 0:
        return None
    return {"rates": [r for ranks in per_rank for r in ranks], "path": session.communication.describe(session.path),
            "device": session.device, "parameters": session.communication.values,
            "shapes": [list(w.shape) for w in session.weights()], **session.communication.summary(),
            **({"compression_auto": session.compression_choice.summary()} if session.compression_choice else {})}


# -- in the parent -------------------------------------------------------------------------------

def summarize(result: dict) -> dict:
    """Per-worker mean samples/s, its 95% spread (1.96 std over iterations and workers), total, step time."""
    flat = [r for worker in result["rates"] for r in worker]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((r - mean) ** 2 for r in flat) / len(flat))
    workers = len(result["rates"])
    total = sum(sum(w) / len(w) for w in result["rates"])
    return {"workers": workers, "per_worker": mean, "spread": 1.96 * std, "total": total}


def with_efficiency(rows: list[dict]) -> list[dict]:
    """Scaling efficiency: total per worker against the smallest world size's (1 when it is in the list)."""
    base = rows[0]["total"] / rows[0]["workers"]
    return [dict(row, efficiency=(row["total"] / row["workers"]) / base) for row in rows]


def table(rows: list[dict], samples_per_step: int) -> str:
    lines = ["| workers | samples/s per worker | total samples/s | step ms | compression ms/step | bytes/step/rank "
             "| wire bytes/step/rank | efficiency |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workers']} | {r['per_worker']:,.1f} +- {r['spread']:,.1f} | {r['total']:,.1f} | "
                     f"{1000 * samples_per_step / r['per_worker']:.2f} | {r.get('compression_ms_per_step', 0):.2f} | "
                     f"{r.get('bytes_sent_per_step', 0):,.0f} | {r.get('wire_bytes_per_step', 0):,.0f} | "
                     f"{100 * r['efficiency']:.1f}% |")
    return "\n".join(lines)


def plot(rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")      # files only, no display
    import matplotlib.pyplot as plt

    sizes = [r["workers"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.errorbar(sizes, [r["total"] for r in rows], marker="o", label="total")
    left.plot(sizes, [rows[0]["total"] / rows[0]["workers"] * n for n in sizes], "--", color="grey",
              label="linear")
    left.set(xlabel="workers", ylabel="samples/s", title="throughput", xticks=sizes)
    left.legend()
    right.plot(sizes, [100 * r["efficiency"] for r in rows], marker="o")
    right.set(xlabel="workers", ylabel="% of linear", title="scaling efficiency", xticks=sizes, ylim=(0, 110))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def model_words(config: Config, options: Options) -> str:
    """What the benchmark trained, in a few words (the table's title)."""
    from toolkit.config import IMAGE_MODELS, Model, unset_default
    if config.model in IMAGE_MODELS:
        size = config.image_size or unset_default("image_size")
        return f"{config.model} on synthetic {size}x{size} images"
    if config.model == Model.TRANSFORMER_LM.value:
        return (f"transformer_lm {config.hidden_layers}x{config.hidden_size}, {config.heads} heads, on "
                f"{config.context} random tokens")
    return f"{config.model} {config.hidden_layers}x{config.hidden_size} on {options.features} features"


def worker_command(config_file: Path, options: Options, result: Path) -> list[str]:
    return [sys.executable, "-m", "toolkit", "bench", "--config", str(config_file),
            "--features", str(options.features), "--classes", str(options.classes),
            "--warmup", str(options.warmup), "--iters", str(options.iters),
            "--steps-per-iter", str(options.steps_per_iter), "--worker-result", str(result)]


def run(config: Config, options: Options, sizes: list[int], out: Path, controller: str | None,
        timeout: float, extra_env: tuple[str, ...] = (), hosts: str | None = None,
        network_interface: str | None = None) -> list[dict]:
    """One launched job per world size; the table on stdout, bench.json and bench.png in `out`."""
    native = config.backend.value == "native"
    if native and config.framework != "torch":
        raise ToolkitError("toolkit bench times Horovod jobs and torch's own engine; for TensorFlow's own "
                           "strategies use benchmarks/peers/mwms_tf_synthetic.py (see docs/BENCHMARKS.md)")
    if native and controller:
        raise ToolkitError(f"--{controller} is a Horovod controller; backend native runs torchrun: drop it")
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / "config.yaml"
    config_file.write_text(config.to_yaml())
    rows = []
    for n in sizes:
        result = out / f"np{n}.json"
        result.unlink(missing_ok=True)
        spec = launch.LaunchSpec(command=tuple(worker_command(config_file, options, result)), np=n, hosts=hosts,
                                 controller=controller, env=extra_env, network_interface=network_interface,
                                 launcher="torchrun" if native else "horovodrun")
        code = launch.run(spec, timeout=timeout)
        if code != 0 or not result.is_file():
            raise ToolkitError(f"bench: the {n}-worker job exited with code {code}; its output is above")
        measured = json.loads(result.read_text())
        rows.append({**summarize(measured), "np": n, "path": measured["path"], "device": measured["device"],
                     "parameters": measured["parameters"], "bytes_sent_per_step": measured["bytes_sent_per_step"],
                     "wire_bytes_per_step": measured["wire_bytes_per_step"],
                     "cross_host_bytes_per_step": measured.get("cross_host_bytes_per_step"),
                     "compression_ms_per_step": measured["compression_ms_per_step"], "shapes": measured["shapes"],
                     **({"compression_auto": measured["compression_auto"]} if "compression_auto" in measured else {})})
    rows = with_efficiency(rows)
    samples_per_step = config.batch_size * config.accumulation_steps
    title = (f"{config.framework} {rows[0]['path']}, {model_words(config, options)} "
             f"({rows[0]['parameters'] / 1e6:.1f}M parameters), batch "
             f"{config.batch_size} x {config.accumulation_steps}, compression {config.compression.value}, "
             f"{'torchrun' if native else (controller or 'default') + ' controller'}, {rows[0]['device']}")
    print(title)
    print(table(rows, samples_per_step))
    (out / "bench.json").write_text(json.dumps({"title": title, "config": config.to_dict(),
                                                "options": options.__dict__, "rows": rows}, indent=1) + "\n")
    plot(rows, title, out / "bench.png")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
    return rows
