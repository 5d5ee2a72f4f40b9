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
import contextlib
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
    # the exchange's two forms side by side (bf16 and int8 above: flat on Horovod on a CPU, hierarchical where
    # the job has several hosts of several ranks on GPUs or backend native), and torch's own engine
    ("bf16 flat", ["--compression", "bf16", "--no-hierarchical-exchange"]),
    ("int8 flat", ["--compression", "int8", "--no-hierarchical-exchange"]),
    ("fp32 hierarchical", ["--hierarchical-exchange"]),
    ("bf16 hierarchical", ["--compression", "bf16", "--hierarchical-exchange"]),
    ("int8 hierarchical", ["--compression", "int8", "--hierarchical-exchange"]),
    # beside the backward pass (the rows above, torch: overlap on where the gradient fills several buckets) or after it
    ("bf16 after backward", ["--compression", "bf16", "--no-overlap"]),
    ("int8 after backward", ["--compression", "int8", "--no-overlap"]),
    ("int8 5 MB buckets", ["--compression", "int8", "--bucket-mb", "5"]),
    ("int8 hierarchical after backward", ["--compression", "int8", "--hierarchical-exchange", "--no-overlap"]),
    ("none compiled", ["--compile"]),          # torch.compile (the warm-up steps compile)
    ("none native (DDP)", ["--backend", "native"]),
    ("int8 hierarchical native", ["--backend", "native", "--compression", "int8", "--hierarchical-exchange"]),
    ("auto", ["--compression", "auto"]),       # the probe's pick (its table row names it)
]
BEFORE = ("none", "bf16", "int8", "top-k 1%")
COMPUTE = "forward + backward + update (no exchange)"
HOOKS = [("DDP, no hook", None), ("DDP fp16 hook", "fp16"), ("DDP bf16 hook", "bf16")]


SCRIPT = ROOT / "tests" / "netns_hosts.sh"


def toolkit_row(checkout: Path, np_: int, flags: list[str], a, netns: Path | None = None, steps=None):
    """One `toolkit bench` job; with `netns`, np_ / 2 ranks on each namespace host. `steps`: (warmup,
    iters, steps per iter) instead of the command line's."""
    warmup, iters, per_iter = steps or (a.warmup, a.iters, a.steps)

    def run(out: Path) -> dict:
        controller = [] if "native" in flags else ["--gloo"]       # torchrun has none to choose
        argv = [str(checkout / ".venv" / "bin" / "python"), "-m", "toolkit", "bench", "--np", str(np_), *controller,
                *MODEL, "--warmup", str(warmup), "--iters", str(iters), "--steps-per-iter", str(per_iter),
                "--out", str(out), "--quiet", *flags]
        env = None
        if netns:       # the first half of the ranks on hostA, the rest on hostB, over the (shaped) veth link
            k = np_ // 2
            argv = ["bash", str(SCRIPT), "exec", str(netns), "hostA", *argv, "-H", f"hostA:{k},hostB:{k}",
                    "--network-interface", "tk0"]
            env = {**os.environ, "PATH": f"{netns}/bin{os.pathsep}{os.environ['PATH']}"}
        sent = tk0_bytes(netns) if netns else None
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout, cwd=checkout, env=env)
        if proc.returncode != 0:
            return {"failed": " / ".join(ln for ln in proc.stderr.splitlines() if ln.strip())[-300:]}
        row = json.loads((out / "bench.json").read_text())["rows"][0]
        result = {"step_ms": 1000 * 64 / row["per_worker"], "compression_ms": row.get("compression_ms_per_step"),
                  "bytes": row["bytes_sent_per_step"], "wire": row.get("wire_bytes_per_step"),
                  "cross": row.get("cross_host_bytes_per_step"),
                  "chosen": (row.get("compression_auto") or {}).get("chosen")}
        if netns:       # what hostA's interface sent during the job (all of it: setup, broadcast, steps)
            result["tk0"] = tk0_bytes(netns) - sent
        return result
    return run


def tk0_bytes(hosts: Path) -> int:
    """Bytes hostA's tk0 has sent so far (`ip -s link`'s TX counter)."""
    out = subprocess.run(["bash", str(SCRIPT), "exec", str(hosts), "hostA", "ip", "-j", "-s", "link", "show", "tk0"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


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


@contextlib.contextmanager
def namespace_hosts(flag: str):
    """The two namespace hosts (tests/netns_hosts.sh) for the block, removed after it."""
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Path(tmp) / "hosts"
        up = subprocess.run(["bash", str(SCRIPT), "up", str(hosts)], capture_output=True, text=True, timeout=300)
        if up.returncode != 0:
            raise SystemExit(f"{flag}: cannot make the namespace hosts: {(up.stderr or up.stdout).strip()[-300:]}")
        try:
            yield hosts
        finally:
            subprocess.run(["bash", str(SCRIPT), "down", str(hosts)], capture_output=True, timeout=120)


def link_tables(a) -> int:
    """One table per link rate: the toolkit's methods on two namespace hosts."""
    if a.warmup == 12 and a.iters == 5 and a.steps == 5:     # the defaults: fewer steps on a slow link
        a.warmup, a.iters, a.steps = 3, 3, 2
    texts = []
    with namespace_hosts("--netns") as hosts:
        np_ = 2 * a.ranks_per_host
        methods = [(label, flags) for label, flags in METHODS if not a.methods or label in a.methods.split(",")]
        for rate in a.rates.split(","):
            subprocess.run(["bash", str(SCRIPT), "shape", str(hosts), rate], check=True, timeout=60)
            rows = [(label, toolkit_row(ROOT, np_, flags, a, netns=hosts)) for label, flags in methods]
            if a.before:
                rows += [(f"{label}, before", toolkit_row(a.before.resolve(), np_, flags, a, netns=hosts))
                         for label, flags in methods if label in BEFORE]
            results = measure(rows, a, prefix=f"{rate:8s}")
            texts.append(f"**Link: {'the veth pair, unshaped' if rate == 'none' else rate}, {a.ranks_per_host} "
                         f"x 2 ranks**\n\n" + table(rows, results, None, np_))
    command = (f"`.venv/bin/python -m benchmarks.compression_bench --netns --rates {a.rates} --ranks-per-host "
               f"{a.ranks_per_host}" + (f" --methods '{a.methods}'" if a.methods else "")
               + (" --before DIR" if a.before else "") + f" --rounds {a.rounds} --write-docs`")
    text = (f"Made by {command} on {common.machine()}; {a.warmup} warm-up steps, {a.iters} x {a.steps} "
            "timed.\n\n" + "\n\n".join(texts))
    print(text)
    if a.write_docs:
        common.write_between("COMMUNICATION.md", f"link{a.ranks_per_host}" if a.ranks_per_host > 1 else "link", text)
    return 0


def hostA_expected(kind: str, nbytes: float, k: int) -> float:
    """What hostA's link sends for one collective, k ranks on each host, ranks host by host: a ring
    crosses each way once (one of hostA's ranks sends its whole ring share over it: toolkit/exchange/wire.py);
    an alltoall sends each of hostA's k ranks' parts for hostB's k ranks (k / 2k of each buffer)."""
    from toolkit.exchange import wire
    if kind == "alltoall":
        return k * nbytes * k / (2 * k)
    return wire.sent(kind, nbytes, 2 * k)


def wire_check(a) -> int:
    """hostA's interface counter against the wire model: per step, from two jobs of different lengths."""
    short, long = (1, 1, 2), (1, 1, 10)
    k = a.ranks_per_host
    lines = []
    with namespace_hosts("--wire-check") as hosts:
        checked = a.methods.split(",") if a.methods else ("none", "int8", "top-k 1%", "bf16")
        for label, flags in [(lb, f) for lb, f in METHODS if lb in checked]:
            runs = {}
            for steps in (short, long):
                with tempfile.TemporaryDirectory() as out:
                    runs[steps] = toolkit_row(ROOT, 2 * k, flags, a, netns=hosts, steps=steps)(Path(out))
            if any("failed" in r for r in runs.values()):
                lines.append(f"| {label} | failed | | | | |")
                continue
            measured = (runs[long]["tk0"] - runs[short]["tk0"]) / (long[2] - short[2])
            kind = ["allreduce"] if label.startswith("none") else {"top-k 1%": ["allgather", "allgather"]}.get(
                label, ["alltoall", "allgather"] if k > 1 else ["allgather"])
            if runs[long].get("cross") is not None:    # hierarchical: each of hostA's k ranks allgathers its
                expected = k * runs[long]["cross"]      # shard's payload with its one peer on hostB
            else:
                expected = expected_tk0(label, runs[long], kind, k)
            lines.append([label, f"{runs[long]['bytes']:,.0f}", f"{runs[long]['wire']:,.0f}", f"{expected:,.0f}",
                          f"{measured:,.0f}", f"{measured / expected:.3f}"])
            print(lines[-1], file=sys.stderr, flush=True)
    text = (f"Made by `.venv/bin/python -m benchmarks.compression_bench --wire-check --ranks-per-host {k}` on "
            f"{common.machine()}; per step = (hostA's tk0 TX bytes in a 10-step job - in a 2-step job) / 8.\n\n"
            + common.table(["method", "bytes/step/rank (rank 0)", "wire bytes/step/rank (rank 0)",
                            "hostA's link, model, bytes/step", "hostA's link, measured (ip -s link)",
                            "measured / model"], lines))
    print(text)
    if a.write_docs:
        common.write_between("COMMUNICATION.md", "wire", text)
    return 0


def expected_tk0(label: str, row: dict, kinds: list[str], k: int) -> float:
    """The model's bytes over hostA's link a step, from rank 0's handed bytes split by collective."""
    handed = row["bytes"]
    if kinds == ["allreduce"] or kinds == ["allgather"]:
        return hostA_expected(kinds[0], handed, k)
    if kinds == ["alltoall", "allgather"]:      # whole payload C to the alltoall, C / N to the allgather
        n = 2 * k
        whole = handed * n / (n + 1)
        return hostA_expected("alltoall", whole, k) + hostA_expected("allgather", whole / n, k)
    return hostA_expected("allgather", handed, k)      # top-k: the lengths header is a few bytes


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


def table(rows, results, compute_label: str | None, np_: int = 2) -> str:
    """Medians per row; compression's time against the row without an exchange (forward + backward)."""
    compute = [o["step_ms"] for o in results.get(compute_label, []) if "failed" not in o]
    fwd_bwd = median(compute) if compute else None
    none = median([o["step_ms"] for o in results.get("none", []) if "failed" not in o] or [float("nan")])
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
        wire_text = f"{median([o['wire'] for o in ok]):,.0f}" if ok[0].get("wire") is not None else "n/a"
        rounds = ", ".join(f"{o['step_ms']:.0f}" for o in ok)
        chosen = sorted({o["chosen"] for o in ok if o.get("chosen")})
        if chosen:      # compression: auto: what each round's probe picked
            label = f"{label} (chose {' / '.join(chosen)})"
        lines.append([label, f"{step:.1f}", rounds, f"{step / none:.2f}", comp_text, share, byte_text, wire_text])
    return common.table([f"method ({np_} ranks, Gloo)", "step ms (median)", "rounds", "x none", "compression ms/step",
                         "compression / forward+backward", "bytes/step/rank", "wire bytes/step/rank"], lines)


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
    p.add_argument("--ranks-per-host", type=int, default=1, help="--netns, --wire-check: ranks on each of the 2 hosts")
    p.add_argument("--methods", default="", help="only these rows of the toolkit's methods (labels, comma-separated)")
    p.add_argument("--wire-check", action="store_true", help="hostA's interface counter against wire bytes (root)")
    a = p.parse_args()
    if a.wire_check:
        return wire_check(a)
    if a.netns:
        return link_tables(a)
    # the compute a rank does in these jobs: 2 ranks (one core each), local SGD that never averages in
    # them, and no NaN guard (whose norm is part of every other row's step, not of its compression time)
    rows = [(COMPUTE, toolkit_row(ROOT, 2, ["--sync", "local_sgd", "--local-steps", "100000", "--no-nan-guard"], a))]
    methods = [(label, flags) for label, flags in METHODS if not a.methods or label in a.methods.split(",")]
    rows += [(label, toolkit_row(ROOT, 2, flags, a)) for label, flags in methods]
    if a.before:
        rows += [(f"{label}, before", toolkit_row(a.before.resolve(), 2, flags, a))
                 for label, flags in methods if label in BEFORE]
    rows += [(label, ddp_row(hook, a)) for label, hook in HOOKS]
    results = measure(rows, a)
    command = "`.venv/bin/python -m benchmarks.compression_bench" + (" --before DIR" if a.before else "") + \
              (f" --methods '{a.methods}'" if a.methods else "") + f" --rounds {a.rounds} --write-docs`"
    text = f"Made by {command} on {common.machine()}.\n\n" + table(rows, results, COMPUTE)
    print(text)
    if a.write_docs:
        common.write_between("COMMUNICATION.md", "step", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
