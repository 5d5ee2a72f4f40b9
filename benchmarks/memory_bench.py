"""Memory per rank under `sharding: none | zero1 | fsdp` (torch, backend native): the table behind
docs/BENCHMARKS.md "Sharding: memory per rank".

    .venv/bin/python -m benchmarks.memory_bench                 # ~50M-parameter transformer_lm, 2 ranks, 3 modes
    .venv/bin/python -m benchmarks.memory_bench --write-docs    # also into docs/BENCHMARKS.md

For each mode, one torchrun job of `-np` ranks runs this file's worker (`--worker`) on every rank:
the public API only (`toolkit.start` with framework torch, backend native, the mode's `sharding`,
the built-in `transformer_lm`, Adam; `session.setup`; `session.train_step` on one fixed batch of
random byte tokens), then each rank counts what it holds once the last step is done:

- parameters, gradients (`.grad`) and optimizer state: the bytes of the tensors this rank keeps
  (numel x element size of the local tensor: an FSDP2 DTensor's `.to_local()` shard; for
  ZeroRedundancyOptimizer the state of its local optimizer, `.optim.state`, which holds only this
  rank's share). Not counted: DDP's gradient buckets under none and zero1 (a second copy of the
  gradients while `gradient_as_bucket_view` is off, torch's default and the toolkit's), FSDP's
  transient all-gathered blocks, activations: those show in the RSS only;
- RSS: the peak (`resource.getrusage(RUSAGE_SELF).ru_maxrss`) and the RSS at the time
  (/proc/self/status VmRSS) right after `toolkit.start` (before any model exists: torch's libraries
  and the process group), after `setup` and after the last step; the whole process, torch's own
  libraries included. The whole model is built on every rank before `setup` shards it, and memory
  freed may stay in the process's heap, so the RSS can hide what sharding saves;
- the median step time (each step ended by reading its loss back) and the last step's loss (the same
  data and seed in every mode: the modes should train alike).

Each rank writes one JSON line (stdout and `--result-dir`); the parent prints the table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common  # run as a module from the repository root (the workers too)

ROOT = common.ROOT
BIN = Path(sys.executable).parent
MODES = ("none", "zero1", "fsdp")


# -- on every rank -------------------------------------------------------------------------------------

def _local(t):
    """The part of `t` this rank stores: an FSDP2 DTensor's shard, else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        local = _local(t)
        total += local.numel() * local.element_size()
    return total


def held(model, optimizer) -> dict:
    """Bytes of parameters, gradients and optimizer state held by this rank."""
    import torch
    params = list(model.parameters())
    local_optimizer = getattr(optimizer, "optim", optimizer)       # ZeroRedundancyOptimizer: its local optimizer
    state = [v for s in local_optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"parameters": sum(p.numel() for p in params),         # the whole model's (a DTensor's numel is global)
            "param_bytes": _bytes(params), "grad_bytes": _bytes([p.grad for p in params]),
            "state_bytes": _bytes(state), "optimizer": type(optimizer).__name__,
            "local_optimizer": type(local_optimizer).__name__}


def rss_now() -> int:
    """This process's resident set now (VmRSS of /proc/self/status; Linux), in bytes; 0 elsewhere."""
    try:
        line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0
    return int(line.split()[1]) * 1024


def worker(a) -> int:
    import resource

    import numpy as np

    import toolkit

    session = toolkit.start(dict(framework="torch", backend="native", sharding=a.sharding, model="transformer_lm",
                                 hidden_size=a.hidden_size, hidden_layers=a.hidden_layers, heads=a.heads,
                                 context=a.context, dataset="synthetic", optimizer="adam", lr=a.lr,
                                 batch_size=a.batch_size, quiet=True))
    rss_start = rss_now()
    vocab = 256                 # the built-in datasets' byte tokens (toolkit/data/ondisk.py VOCAB)
    rng = np.random.RandomState(1234)                      # the same batch in every mode
    n = a.batch_size * session.world_size
    tokens = rng.randint(0, vocab, (n, a.context + 1)).astype(np.int64)
    with session.scope():
        model = session.builtin_model(a.context, vocab, (a.context,))
    model, optimizer = session.setup(model)
    rss_setup = rss_now()
    batches = next(session.loader((tokens[:, :-1].copy(), tokens[:, 1:].copy()), shuffle=False).steps())
    times, loss = [], None
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = session.train_step(batches)
        loss = session.to_float(loss)
        times.append(time.perf_counter() - t0)
    row = {"sharding": a.sharding, "rank": session.rank, "size": session.size, "path": session.path,
           **held(model, optimizer), "rss_start_bytes": rss_start, "rss_setup_bytes": rss_setup,
           "rss_end_bytes": rss_now(), "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "step_s": times, "median_step_s": statistics.median(times[1:] or times), "last_loss": loss}
    line = json.dumps(row)
    if a.result_dir:
        Path(a.result_dir, f"rank{session.rank}.json").write_text(line + "\n")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0


# -- the parent ----------------------------------------------------------------------------------------

def run_mode(a, mode: str) -> list[dict] | str:
    """One torchrun job; every rank's row, or the error (the command and the tail of its output)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(a.np), "-m", "benchmarks.memory_bench",
                "--worker", "--sharding", mode, "--hidden-size", str(a.hidden_size), "--hidden-layers",
                str(a.hidden_layers), "--heads", str(a.heads), "--context", str(a.context), "--batch-size",
                str(a.batch_size), "--steps", str(a.steps), "--lr", str(a.lr), "--result-dir", tmp]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return f"timed out after {a.timeout} s: {' '.join(argv[:-2])}"
        rows = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
        if proc.returncode != 0 or len(rows) != a.np:
            tail = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()][-4:]
            return f"exit {proc.returncode}: {' / '.join(tail)[-600:]}"
        print(f"{mode}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        return sorted(rows, key=lambda r: r["rank"])


def table(results: dict) -> str:
    mb = 1 / 2 ** 20
    base = results.get("none")
    base_total = (base[0]["param_bytes"] + base[0]["grad_bytes"] + base[0]["state_bytes"]
                  if isinstance(base, list) else None)
    lines = []
    for mode, rows in results.items():
        if isinstance(rows, str):
            lines.append(f"| {mode} | failed: {rows.replace('|', '/')} | | | | | | | | | | | | |")
            continue
        for r in rows:
            total = r["param_bytes"] + r["grad_bytes"] + r["state_bytes"]
            opt = r["optimizer"]
            if r["local_optimizer"] != opt:
                opt += f" ({r['local_optimizer']})"
            lines.append([mode, r["rank"], opt, f"{r['param_bytes'] * mb:,.1f}", f"{r['grad_bytes'] * mb:,.1f}",
                          f"{r['state_bytes'] * mb:,.1f}", f"{total * mb:,.1f}",
                          f"{total / base_total:.3f}" if base_total else "n/a",
                          f"{r['rss_start_bytes'] * mb:,.0f}", f"{r['rss_setup_bytes'] * mb:,.0f}",
                          f"{r['rss_end_bytes'] * mb:,.0f}", f"{r['peak_rss_bytes'] * mb:,.0f}",
                          f"{r['median_step_s']:.2f}", f"{r['last_loss']:.4f}"])
    return common.table(["sharding", "rank", "optimizer", "parameters MiB", "gradients MiB", "optimizer state MiB",
                         "sum MiB", "sum x none", "RSS after start MiB", "RSS after setup MiB",
                         "RSS after last step MiB", "peak RSS MiB", "median step s",
                         "last loss"], lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help="sharding modes, comma separated (default all three)")
    p.add_argument("-np", dest="np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--hidden-size", type=int, default=512, help="transformer_lm width (default 512)")
    p.add_argument("--hidden-layers", type=int, default=16, help="transformer_lm blocks (default 16: ~50.8M parameters "
                   "at width 512)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    p.add_argument("--context", type=int, default=128, help="tokens per sample (default 128)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per step (default 4)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps; the median leaves out the first (default 5)")
    p.add_argument("--lr", type=float, default=3e-4, help="Adam's learning rate (default 3e-4)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per mode's job (default 600)")
    p.add_argument("--write-docs", action="store_true", help="also write the table into docs/BENCHMARKS.md")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)        # one rank, under torchrun
    p.add_argument("--sharding", default="none", help=argparse.SUPPRESS)
    p.add_argument("--result-dir", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    results = {mode: run_mode(a, mode) for mode in modes}
    ok = next((rows for rows in results.values() if isinstance(rows, list)), None)
    params = f"{ok[0]['parameters'] / 1e6:.2f}M parameters" if ok else "parameters unknown (every mode failed)"
    command = (f"`.venv/bin/python -m benchmarks.memory_bench --modes {','.join(modes)} -np {a.np} --hidden-size "
               f"{a.hidden_size} --hidden-layers {a.hidden_layers} --heads {a.heads} --context {a.context} "
               f"--batch-size {a.batch_size} --steps {a.steps} --write-docs`")
    text = (f"Made by {command} on {common.machine()}. torch {_torch_version()}, backend native under torchrun "
            f"(Gloo), built-in transformer_lm {a.hidden_layers} x {a.hidden_size}, {a.heads} heads, context "
            f"{a.context}, vocabulary 256 ({params}, float32), Adam, batch {a.batch_size} per rank, {a.steps} steps "
            f"(median of the last {max(1, a.steps - 1)}); MiB = 2^20 bytes, counted on each rank after the last "
            f"step. The engine each mode ran (`session.path`): "
            + "; ".join(f"{mode}: {rows[0]['path']}" for mode, rows in results.items() if isinstance(rows, list))
            + ".\n\n" + table(results))
    print(text)
    if a.write_docs:
        common.write_between("BENCHMARKS.md", "memory", text)
    return 0 if all(isinstance(rows, list) for rows in results.values()) else 1


def _torch_version() -> str:
    from importlib.metadata import version
    return version("torch")


if __name__ == "__main__":
    sys.exit(main())
