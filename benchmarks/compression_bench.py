"""Step time of every compression method, side by side: the table behind docs/COMMUNICATION.md's
`<!-- step:begin -->` block.

    .venv/bin/python -m benchmarks.compression_bench                      # ~15 min on 2 cores: print only
    .venv/bin/python -m benchmarks.compression_bench --before /tmp/before --write-docs

Each row is one `toolkit bench` job (the toolkit's real step on one fixed batch, no data loading) of
the MLP the issue measured (1024 features, 3 x 2048 hidden, 10.5M parameters, batch 64), 2 ranks
over Gloo, read from its bench.json: step time (median over rounds), the time per step spent
compressing and decompressing (`compression_ms_per_step`), and the bytes each rank handed to
collectives per step. One row with no exchange gives forward + backward + update on each of the 2
ranks (local SGD that never averages within the job, no NaN guard), what compression's cost is
compared to. `--before DIR` adds rows run from another checkout of the
toolkit (e.g. `git worktree add DIR <commit>`, with `.venv` linked in; its adapters must be its own:
`ln -s ../adapters DIR/toolkit/adapters`). The peers are torch DDP's communication hooks under
torchrun on the same model and batch (benchmarks/peers/ddp_torch_synthetic.py; its PowerSGD hook fails
on Gloo, see there). Rows run in turn within a round, so a slow spell of the machine hits every row.

    .venv/bin/python -m benchmarks.compression_bench --netns --rates none,1gbit,100mbit --write-docs   # root

`--netns`: the two ranks run on two network-namespace hosts joined by a veth pair
(tests/netns_hosts.sh, made and removed here), the link shaped to each rate in turn (`tc qdisc ... tbf
rate R` on both ends; `none` = the veth unshaped), so the network is the bottleneck: one table
per rate (`<!-- link:begin -->`), toolkit rows only, fewer steps (a dense step takes seconds at 100 Mbit/s).
The shaping is a token bucket (`tc ... tbf`): this kernel has no `netem`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from toolkit.planner.bench import summarize

ROOT = common.ROOT
MODEL = ["--features", "1024", "--hidden-size", "2048", "--hidden-layers", "3", "--batch-size", "64"]
METHODS = [
    ("none", []),
    ("fp16 (Horovod's)", ["--compression", "fp16"]),
    ("bf16", ["--compression", "bf16"]),
    ("int8", ["--compression", "int8"]),
    ("top-k 1%", ["--compression", "topk"]),
    ("top-k 1% + DGC", ["--compression", "topk", "--dgc"]),
    ("PowerSGD rank 1", ["--compression", "powersgd", "--powersgd-rank", "1"]),
    ("PowerSGD rank 2", ["--compression", "powersgd", "--powersgd-rank", "2"]),
    ("PowerSGD rank 4", ["--compression", "powersgd", "--powersgd-rank", "4"]),
]
BEFORE = ("none", "bf16", "int8", "top-k 1%")
COMPUTE = "forward + backward + update (no exchange)"
HOOKS = [("DDP, no hook", None), ("DDP fp16 hook", "fp16"), ("DDP bf16 hook", "bf16")]


SCRIPT = ROOT / "tests" / "netns_hosts.sh"


def toolkit_row(checkout: Path, np_: int, flags: list[str], a, netns: Path | None = None):
    def run(out: Path) -> dict:
        argv = [str(checkout / ".venv" / "bin" / "python"), "-m", "toolkit", "bench", "--np", str(np_), "--gloo",
                *MODEL, "--warmup", str(a.warmup), "--iters", str(a.iters), "--steps-per-iter", str(a.steps),
                "--out", str(out), "--quiet", *flags]
        env = None
        if netns:       # rank 0 on hostA, rank 1 on hostB, over the (shaped) veth link
            argv = ["bash", str(SCRIPT), "exec", str(netns), "hostA", *argv, "-H", "hostA:1,hostB:1",
                    "--network-interface", "tk0"]
            env = {**os.environ, "PATH": f"{netns}/bin{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout, cwd=checkout, env=env)
        if proc.returncode != 0:
            return {"failed": " / ".join(ln for ln in proc.stderr.splitlines() if ln.strip())[-300:]}
        row = json.loads((out / "bench.json").read_text())["rows"][0]
        return {"step_ms": 1000 * 64 / row["per_worker"], "compression_ms": row.get("compression_ms_per_step"),
                "bytes": row["bytes_sent_per_step"]}
    return run


def ddp_row(hook: str | None, a):
    def run(out: Path) -> dict:
        argv = [str(ROOT / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc-per-node", "2",
                str(ROOT / "benchmarks" / "peers" / "ddp_torch_synthetic.py"), *MODEL, "--warmup", str(a.warmup),
                "--iters", str(a.iters), "--steps-per-iter", str(a.steps), "--result", str(out / "r.json"),
                *(["--hook", hook] if hook else [])]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
        if proc.returncode != 0:
            return {"failed": " / ".join(ln for ln in proc.stderr.splitlines() if "Error" in ln)[-300:]}
        per_worker = summarize(json.loads((out / "r.json").read_text()))["per_worker"]
        return {"step_ms": 1000 * 64 / per_worker, "compression_ms": None, "bytes": None}
    return run


def link_tables(a) -> int:
    """One table per link rate: the toolkit's methods on two namespace hosts."""
    if a.warmup == 12 and a.iters == 5 and a.steps == 5:     # the defaults: fewer steps on a slow link
        a.warmup, a.iters, a.steps = 3, 3, 2
    texts = []
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Path(tmp) / "hosts"
        up = subprocess.run(["bash", str(SCRIPT), "up", str(hosts)], capture_output=True, text=True, timeout=300)
        if up.returncode != 0:
            raise SystemExit(f"--netns: cannot make the namespace hosts: {(up.stderr or up.stdout).strip()[-300:]}")
        try:
            for rate in a.rates.split(","):
                subprocess.run(["bash", str(SCRIPT), "shape", str(hosts), rate], check=True, timeout=60)
                rows = [(label, toolkit_row(ROOT, 2, flags, a, netns=hosts)) for label, flags in METHODS]
                results = measure(rows, a, prefix=f"{rate:8s}")
                texts.append(f"**Link: {'the veth pair, unshaped' if rate == 'none' else rate}**\n\n"
                             + table(rows, results, None))
        finally:
            subprocess.run(["bash", str(SCRIPT), "down", str(hosts)], capture_output=True, timeout=120)
    command = f"`.venv/bin/python -m benchmarks.compression_bench --netns --rates {a.rates} --rounds {a.rounds} --write-docs`"
    text = (f"Made by {command} on {common.machine()}; {a.warmup} warm-up steps, {a.iters} x {a.steps} "
            "timed.\n\n" + "\n\n".join(texts))
    print(text)
    if a.write_docs:
        common.write_between("COMMUNICATION.md", "link", text)
    return 0


def measure(rows, a, prefix: str = "") -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {label: [] for label, _ in rows}
    for round_ in range(a.rounds):
        for label, run in rows:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                out = run(Path(tmp))
            results[label].append(out)
            shown = out.get("failed") or f"{out['step_ms']:.1f} ms/step"
            print(f"{prefix}round {round_ + 1}  {label:45s} {shown}  ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    return results


def median(values: list[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2]


def table(rows, results, compute_label: str | None) -> str:
    """Medians per row; compression's time against the row without an exchange (forward + backward)."""
    compute = [o["step_ms"] for o in results.get(compute_label, []) if "failed" not in o]
    fwd_bwd = median(compute) if compute else None
    none = median([o["step_ms"] for o in results["none"] if "failed" not in o] or [float("nan")])
    lines = []
    for label, _ in rows:
        ok = [o for o in results[label] if "failed" not in o]
        if not ok:
            lines.append(f"| {label} | failed: {results[label][-1]['failed'].replace('|', '/')} | | | | | |")
            continue
        step = median([o["step_ms"] for o in ok])
        comp_ms = median([o["compression_ms"] for o in ok]) if ok[0]["compression_ms"] is not None else None
        if comp_ms is None:
            comp_text, share = "n/a", "n/a"
        else:
            comp_text = f"{comp_ms:.1f}"
            share = f"{100 * comp_ms / fwd_bwd:.0f}%" if fwd_bwd else "-"
        byte_text = f"{median([o['bytes'] for o in ok]):,.0f}" if ok[0]["bytes"] is not None else "n/a"
        rounds = ", ".join(f"{o['step_ms']:.0f}" for o in ok)
        lines.append([label, f"{step:.1f}", rounds, f"{step / none:.2f}", comp_text, share, byte_text])
    return common.table(["method (2 ranks, Gloo)", "step ms (median)", "rounds", "x none", "compression ms/step",
                         "compression / forward+backward", "bytes/step/rank"], lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="another checkout of the toolkit to run the BEFORE rows from")
    p.add_argument("--rounds", type=int, default=2, help="rounds over all rows; each row shows its median")
    p.add_argument("--warmup", type=int, default=12, help="untimed steps per job (default 12)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per job (default 5)")
    p.add_argument("--steps", type=int, default=5, help="steps per timed iteration (default 5)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--write-docs", action="store_true", help="write the table into docs/COMMUNICATION.md")
    p.add_argument("--netns", action="store_true", help="2 namespace hosts over a shaped link (root; see above)")
    p.add_argument("--rates", default="none,1gbit,100mbit", help="--netns: link rates, tc's units (default "
                   "none,1gbit,100mbit)")
    a = p.parse_args()
    if a.netns:
        return link_tables(a)
    # the compute a rank does in these jobs: 2 ranks (one core each), local SGD that never averages in
    # them, and no NaN guard (whose norm is part of every other row's step, not of its compression time)
    rows = [(COMPUTE, toolkit_row(ROOT, 2, ["--sync", "local_sgd", "--local-steps", "100000", "--no-nan-guard"], a))]
    rows += [(label, toolkit_row(ROOT, 2, flags, a)) for label, flags in METHODS]
    if a.before:
        rows += [(f"{label}, before", toolkit_row(a.before.resolve(), 2, flags, a))
                 for label, flags in METHODS if label in BEFORE]
    rows += [(label, ddp_row(hook, a)) for label, hook in HOOKS]
    results = measure(rows, a)
    command = "`.venv/bin/python -m benchmarks.compression_bench" + (" --before DIR" if a.before else "") + \
              f" --rounds {a.rounds} --write-docs`"
    text = f"Made by {command} on {common.machine()}.\n\n" + table(rows, results, COMPUTE)
    print(text)
    if a.write_docs:
        common.write_between("COMMUNICATION.md", "step", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
