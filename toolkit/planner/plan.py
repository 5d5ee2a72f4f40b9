"""`toolkit plan`: how a config's model will scale on a cluster, for each communication method.

Inputs: one worker's step (compute time and gradient shapes) from `toolkit bench` at one worker (a
bench.json, or the plan runs the bench itself), or a step time given; the cluster as flags or as a
calibration file (benchmarks/scaling_calibrate.py). Each method's bytes come from the code that counts
`bytes_sent_per_step` in training: Horovod's path counts 4 bytes a value (2 with fp16,
toolkit/exchange/communication.py), and the toolkit's exchanges (bf16, int8, topk, powersgd) are run once
here on gradients of the model's shapes, through a recorder in place of the collectives, which
notes each collective and its bytes (`record`); the same run times their compression work on this
machine's CPU (numpy), unless `--compression-ms` gives it. PyTorch DDP (ddp, ddp_fp16: the other
engine, torch's backend native) sends 4 bytes a value in torch's default buckets (2 with its fp16
hook). toolkit/planner/scaling.py prices it all.
Output: a table (efficiency and samples/s per method and GPU count), plan.json, plan.png and the
method recommended (and, with both engines' methods in the plan, which engine), with its reason.
"""
from __future__ import annotations

import json
import statistics
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path

from toolkit import registry
from toolkit.config import Config, unset_default
from toolkit.errors import ToolkitError
from toolkit.planner import scaling, units

# Horovod's path (its compressions, then its other ways to reduce), then PyTorch DDP's (the torch
# backend native: plain, and with its fp16 communication hook; the bf16 hook sends the same bytes),
# then the toolkit's exchanges, then local SGD: the first is the baseline.
EXCHANGES = registry.TOOLKIT_COMPRESSIONS
# bf16 and int8 in the exchange's two levels (float32 inside a node, compressed across: hierarchical_exchange)
LEVELS = ("bf16_hierarchical", "int8_hierarchical")
DDP = ("ddp", "ddp_fp16")
METHODS = (*registry.HOROVOD_COMPRESSIONS, "hierarchical", "adasum", "no_fusion", *DDP, *EXCHANGES, *LEVELS,
           "local_sgd")
_COMMUNICATION_KEYS = ("compression", "topk_ratio", "powersgd_rank", "powersgd_warmup_steps", "dgc",
                       "dgc_warmup_epochs", "dgc_masking", "error_feedback", "sync", "local_steps",
                       "sync_warmup_steps", "op")


def parse_methods(text: str) -> list[str]:
    names = [m.strip() for m in str(text).split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise ToolkitError(f"--methods {text!r}: unknown method {', '.join(unknown) or '(none given)'}; "
                           f"choose from {', '.join(METHODS)}")
    return [m for m in METHODS if m in names]


@dataclass(frozen=True)
class OneWorker:
    """One worker's step: what the plan scales."""
    step_s: float
    shapes: list            # the trainable parameters' shapes, in the order of the session's gradients
    samples_per_step: int   # per worker
    title: str


def from_bench(path: Path) -> OneWorker:
    """The 1-worker row of a `toolkit bench` result (bench.json or the folder that holds it)."""
    path = path / "bench.json" if path.is_dir() else path
    try:
        result = json.loads(path.read_text())
        row, config = result["rows"][0], result["config"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise ToolkitError(f"--bench {path}: not a toolkit bench result ({e}); make one with "
                           f"toolkit bench --np 1 --out DIR") from None
    if row["workers"] != 1:
        raise ToolkitError(f"--bench {path}: its smallest world size is {row['workers']}, the plan needs one "
                           f"worker's step: toolkit bench --np 1")
    if not row.get("shapes"):
        raise ToolkitError(f"--bench {path}: it has no gradient shapes (written by an older toolkit); "
                           f"run toolkit bench --np 1 again")
    samples = int(config["batch_size"]) * int(config.get("accumulation_steps", 1))
    return OneWorker(step_s=samples / row["per_worker"], shapes=[tuple(s) for s in row["shapes"]],
                     samples_per_step=samples, title=result["title"])


# -- each method's collectives, recorded from the toolkit's own exchange ---------------------------

class Recorder:
    """Stands in for the session's collectives (adapters/base.py): notes each one and its bytes, and
    returns what `world` identical ranks would (allreduce: the input; allgather: `world` copies).
    `timer`: the exchange's; its reading at the first collective is kept (`before_first`)."""

    rank = 0
    calls: list             # (kind, bytes) of each collective

    def __init__(self, ops, world: int, timer=None):
        self.ops, self.world, self.calls, self.timer, self.before_first = ops, world, [], timer, None

    def _note(self, name: str, buf) -> None:
        if self.before_first is None and self.timer is not None:
            self.before_first = self.timer.seconds
        self.calls.append((name, int(buf.nbytes)))

    def allreduce(self, buf, average: bool = True):
        self._note("allreduce", buf)
        return buf

    def allgather(self, buf):
        self._note("allgather", buf)
        return self.ops.cat([buf] * self.world)


def exchange_config(config: Config, name: str) -> Config:
    """The config with its communication replaced by method `name` (its own settings kept when it is that one)."""
    values = {k: v for k, v in config.to_dict().items() if k not in _COMMUNICATION_KEYS}
    own = config.compression.value == name
    values["compression"] = name
    if name == "topk":
        values["topk_ratio"] = config.topk_ratio if own else None
    if name == "powersgd":
        values["powersgd_rank"] = config.powersgd_rank if own else None
    if name not in ("bf16", "int8"):       # overlap: true is theirs only
        values["overlap"] = None
    return Config.from_dict(values)


def record(config: Config, name: str, shapes: list, compression_s: float | None, rounds: int = 3) -> scaling.Method:
    """Method `name` of the toolkit's exchange on random gradients of `shapes`: its collectives (as one
    rank of two sends them) and, unless given, its compression work timed here (median of `rounds`):
    compress once plus one decode-and-add per rank."""
    import numpy as np

    from toolkit.exchange import arrays
    from toolkit.exchange.exchanges import make_exchange

    cfg = exchange_config(config, name)
    ops = arrays.numpy_ops()
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    exchange, compress_times, decode_times = make_exchange(cfg, ops), [], []
    exchange.form, exchange.chosen_for = "allgather", 0     # bf16, int8: recorded gathered; `collectives_at` prices the other form at N
    for i in range(1 + (rounds if compression_s is None else 0)):
        recorder = Recorder(ops, 2, exchange.timer)
        before = exchange.timer.seconds
        exchange.exchange([g.copy() for g in grads], recorder, 2)
        if i:       # timed apart, not by difference: the work before the first collective is compression
            spent = exchange.timer.seconds - before
            first = (recorder.before_first if recorder.before_first is not None else exchange.timer.seconds) - before
            compress_times.append(spent if name == "powersgd" else first)
            decode_times.append(0.0 if name == "powersgd" else (spent - first) / 2)
    calls = recorder.calls
    assert sum(b for _, b in calls) == exchange.last_bytes      # what bytes_sent_per_step counts
    if compression_s is None:
        compress, decode = statistics.median(compress_times), statistics.median(decode_times)
    else:
        compress, decode = compression_s, 0.0
    label = (f"topk {cfg.topk_ratio:g}" if name == "topk" else
             f"powersgd rank {cfg.powersgd_rank}" if name == "powersgd" else name)
    # torch overlaps bf16 and int8 with the backward pass on a GPU (overlap unset) or when asked (overlap: true)
    overlaps = cfg.overlap_capable and cfg.framework == "torch" and config.overlap is not False
    return scaling.Method(label, "exchange", collectives=tuple(calls), compress_s=compress,
                          decode_s=decode, lossless=False, reducible=name in ("bf16", "int8"),
                          bucket_bytes=config.bucket_mb * 2**20 if overlaps else 0.0)


def methods(config: Config, names: list[str], shapes: list, compression_s: float | None) -> list[scaling.Method]:
    fusion = None if config.fusion_threshold_mb is None else config.fusion_threshold_mb * 1024 * 1024
    cycle = None if config.cycle_time_ms is None else config.cycle_time_ms / 1000
    horovod = {
        "none": scaling.Method("none", "horovod"),
        "fp16": scaling.Method("fp16", "horovod", value_bytes=2, lossless=False),
        "hierarchical": scaling.Method("hierarchical", "horovod", reduce="hierarchical"),
        "adasum": scaling.Method("adasum", "horovod", reduce="adasum", lossless=False),
        "no_fusion": scaling.Method("no_fusion", "horovod", fusion_bytes=0),
    }
    ddp = {"ddp": scaling.Method("ddp", "ddp"),      # torch's default buckets (Horovod's knobs do not apply)
           "ddp_fp16": scaling.Method("ddp_fp16", "ddp", value_bytes=2, lossless=False)}
    out = []
    for name in names:
        if name in horovod:
            method = horovod[name]
            out.append(scaling.with_fusion(method, None if name == "no_fusion" else fusion, cycle))
        elif name in ddp:
            out.append(ddp[name])
        elif name in LEVELS:
            flat = record(config, name.split("_")[0], shapes, compression_s)
            out.append(replace(flat, name=f"{flat.name} hierarchical", hierarchical=True))
        elif name == "local_sgd":
            k = config.local_steps or unset_default("local_steps")
            out.append(scaling.Method(f"local_sgd k={k}", "local_sgd", local_steps=k, lossless=False))
        else:
            out.append(record(config, name, shapes, compression_s))
    return out


def state_values(config: Config, values: int) -> int:
    """What local SGD averages: the parameters and the optimizer's slots (momentum: 1; adam: 2)."""
    slots = 2 if config.optimizer.value == "adam" else (1 if config.optimizer_momentum else 0)
    return values * (1 + slots)


# -- output ----------------------------------------------------------------------------------------

def table(plan: scaling.Plan, samples_per_step: int) -> str:
    """Per method: bytes handed to collectives and bytes sent over the links per step and GPU (at the
    largest N), then efficiency and throughput at each N."""
    n = plan.gpus[-1]
    head = (f"| method | bytes/step/GPU | wire bytes/step/GPU at {n} | "
            + " | ".join(f"{g} GPUs: eff., samples/s" for g in plan.gpus) + " |")
    lines = [head, "|" + "---|" * (3 + len(plan.gpus))]
    for m in plan.methods:
        cells = [f"{100 * c.efficiency:.1f}%, {c.n * samples_per_step / c.step_s:,.0f}" for c in plan.rows[m.name]]
        last = plan.rows[m.name][-1]
        lines.append(f"| {m.name} | {last.bytes_per_step:,.0f} | {last.wire_bytes_per_step:,.0f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def crossing_table(plan: scaling.Plan, crossings: dict, base: str | None = None) -> str:
    """Per method and N: the link speed below which it beats `base` (the first method, none), the link the
    ring crosses varied alone."""
    first = base or plan.methods[0].name
    lines = [f"| beats {first} when the link is below | " + " | ".join(f"{n} GPUs" for n in plan.gpus) + " |",
             "|" + "---|" * (1 + len(plan.gpus))]

    def words(bw):
        if bw is None:
            return "never (not at 1 Mbit/s)"
        return "any link" if bw >= 1e13 else units.format_bandwidth(bw)
    for name, row in crossings.items():
        lines.append(f"| {name} | " + " | ".join(words(bw) for bw in row) + " |")
    return "\n".join(lines)


def plot(plan: scaling.Plan, samples_per_step: int, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")      # files only, no display
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for m in plan.methods:
        rows = plan.rows[m.name]
        style = "-" if m.lossless else "--"
        left.plot(plan.gpus, [100 * c.efficiency for c in rows], style, marker="o", label=m.name)
        right.plot(plan.gpus, [c.n * samples_per_step / c.step_s for c in rows], style, marker="o", label=m.name)
    right.plot(plan.gpus, [n * samples_per_step / plan.workload.compute_s for n in plan.gpus], ":", color="grey",
               label="linear")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(plan.gpus, [str(n) for n in plan.gpus])
    left.set(xlabel="GPUs", ylabel="% of linear", title="scaling efficiency", ylim=(0, 105))
    right.set(xlabel="GPUs", ylabel="samples/s", title="throughput", yscale="log")
    right.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 150), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(config: Config, worker: OneWorker, cluster: scaling.Cluster, gpus: list[int], names: list[str],
        out: Path, straggle: float = 0.0, backward_fraction: float = 2 / 3, compression_s: float | None = None,
        cluster_words: str = "") -> scaling.Plan:
    values = [int(_prod(s)) for s in worker.shapes]
    workload = scaling.Workload(compute_s=worker.step_s, tensor_values=tuple(reversed(values)),
                                backward_fraction=backward_fraction, straggle=straggle,
                                state_values=state_values(config, sum(values)))
    t0 = time.perf_counter()
    plan = scaling.Plan(workload, cluster, methods(config, names, worker.shapes, compression_s), gpus).run()
    measured = time.perf_counter() - t0
    pick, why = plan.recommend()
    title = (f"{worker.title}: {sum(values) / 1e6:.1f}M parameters, {1000 * worker.step_s:.1f} ms a step at one "
             f"worker, {worker.samples_per_step} samples; {cluster_words}")
    print(title)
    print(table(plan, worker.samples_per_step))
    if compression_s is None and any(m.kind == "exchange" for m in plan.methods):
        print(f"(the toolkit's compression work timed here on this CPU with numpy, {measured:.0f} s; "
              f"--compression-ms gives it for your device)")
    crossings = plan.crossings()
    print(crossing_table(plan, crossings))
    # against the best 16-bit baseline too, where the plan has it and it is not the first
    against_fp16 = plan.crossings("fp16") if "fp16" in names and plan.methods[0].name != "fp16" else None
    if against_fp16:
        print(crossing_table(plan, against_fp16, "fp16"))
    print(f"recommended: {pick.name}: {why}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps({
        "title": title, "recommended": pick.name, "engine": pick.engine, "reason": why, "gpus": gpus,
        "engines": {m.name: m.engine for m in plan.methods},
        "beats_first_below_bytes_per_s": crossings,
        **({"beats_fp16_below_bytes_per_s": against_fp16} if against_fp16 else {}),
        "rows": {m.name: [dict(c.__dict__, efficiency=c.efficiency,
                               samples_per_s=c.n * worker.samples_per_step / c.step_s) for c in plan.rows[m.name]]
                 for m in plan.methods}}, indent=1) + "\n")
    plot(plan, worker.samples_per_step, title, out / "plan.png")
    print(f"wrote {out / 'plan.json'} and {out / 'plan.png'}")
    return plan


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
