"""Calibrate `toolkit plan`'s cost model on this machine and check its step predictions (docs/SCALING.md).

    .venv/bin/python -m benchmarks.scaling_calibrate --write-docs        # root (namespace hosts); ~30 min

1. **Collectives.** Horovod allreduce and allgather of float32 torch tensors, 1 KB to 256 MB, timed
   on every rank (each round starts after a barrier; a round's time is its slowest rank's; the median
   of the rounds): over Gloo and over MPI on loopback, and between the two namespace hosts of
   tests/netns_hosts.sh at 2, 3 and 4 ranks (hostA:1,hostB:1; hostA:2,hostB:1; hostA:2,hostB:2) with
   their veth link unshaped and shaped by `tc tbf` to each rate of --rates (sizes that would take
   longer than about 3 s on the link are left out). toolkit.planner.calibration.fit gives alpha and bandwidth per
   link: runs/scaling/calibration-<link>.json, the `--calibration` file of `toolkit plan`.
2. **Steps.** `toolkit bench` of an MLP (3 x 1024, 3.2M parameters, batch 64) at 2, 3 and 4 ranks
   across the namespace hosts at each --check-rates rate, for none / fp16 / topk / powersgd, against
   the model's prediction from the calibrated links (the link's as inter-node, Gloo loopback's as
   intra-node) and the compute each rank has while N ranks share this machine's cores: measured by
   the same bench under local SGD with one model average in a million steps (no communication), and
   the compression work the 1-worker bench measured.

`--worker FILE` is the timing run on each rank (launched by the script itself).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from benchmarks import common
from toolkit.exchange import wire
from toolkit.planner import calibration, scaling, units

ROOT = common.ROOT

PY = str(ROOT / ".venv" / "bin" / "python")
SCRIPT = ROOT / "tests" / "netns_hosts.sh"
SIZES = [2 ** k for k in (10, 14, 18, 20, 22, 24, 26, 28)]          # 1 KiB .. 256 MiB
BURST = 512 * 1024      # tc tbf's burst (netns_hosts.sh): a shaped link sends this much at the veth's own speed
PLACEMENT = {2: "hostA:1,hostB:1", 3: "hostA:2,hostB:1", 4: "hostA:2,hostB:2"}
MODEL = ["--framework", "torch", "--hidden-size", "1024", "--hidden-layers", "3", "--features", "1024",
         "--batch-size", "64"]
METHODS = [("none", []), ("fp16", ["--compression", "fp16"]), ("topk 0.01", ["--compression", "topk"]),
           ("powersgd rank 1", ["--compression", "powersgd"])]


# -- on every rank ---------------------------------------------------------------------------------

def worker(out: str, sizes: list[int], rounds: int) -> None:
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.set_num_threads(1)
    for i in range(5):                  # the first collectives after init are slower (connections, buffers)
        hvd.allreduce(torch.ones(1024), name=f"warm.{i}")
    samples = []
    for kind in ("allreduce", "allgather", "alltoall"):
        for size in sizes:
            x = torch.ones(size // 4)
            times = []
            for i in range(1 + rounds):
                hvd.barrier()
                t0 = time.perf_counter()
                if kind == "allreduce":
                    hvd.allreduce(x, op=hvd.Sum, name=f"{kind}.{size}")
                elif kind == "allgather":
                    hvd.allgather(x, name=f"{kind}.{size}")
                else:               # equal parts for every rank: the whole buffer crosses (N-1)/N
                    hvd.alltoall(x[:len(x) // hvd.size() * hvd.size()], name=f"{kind}.{size}")
                slowest = max(hvd.allgather_object(time.perf_counter() - t0, name=f"t.{kind}.{size}.{i}"))
                if i:
                    times.append(slowest)
            samples.append({"kind": kind, "n": hvd.size(), "nbytes": size, "seconds": statistics.median(times)})
    if hvd.rank() == 0:
        Path(out).write_text(json.dumps(samples) + "\n")


# -- in the parent ---------------------------------------------------------------------------------

def launched(argv: list[str], netns: Path | None, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if netns:
        argv = ["bash", str(SCRIPT), "exec", str(netns), "hostA", *argv]
        env["PATH"] = f"{netns}/bin{os.pathsep}{env['PATH']}"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return proc


def time_collectives(n: int, controller: str, netns: Path | None, max_bytes: float, rounds: int, a) -> list[dict]:
    sizes = [s for s in SIZES if s <= max_bytes]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.json"
        where = ["-H", PLACEMENT[n], "--network-interface", "tk0"] if netns else ["--network-interface", "lo"]
        launched([PY, "-m", "toolkit", "launch", "-np", str(n), f"--{controller}", *where, "--timeout",
                  str(a.timeout), "--", PY, "-m", "benchmarks.scaling_calibrate", "--worker", str(out),
                  "--sizes", ",".join(map(str, sizes)), "--rounds", str(rounds)], netns, a.timeout + 60)
        return json.loads(out.read_text())


def fit_link(name: str, samples: list[dict], out: Path, shaped: bool = False) -> dict:
    """A token bucket passes its burst at the unshaped speed, which no alpha-beta link does: a shaped
    link is fitted on the messages larger than twice the burst (all are kept in the file)."""
    objs = [calibration.Sample(**s) for s in samples if not shaped or s["nbytes"] > 2 * BURST]
    link = calibration.fit(objs)
    kinds = {kind: {"alpha": k.alpha, "bandwidth": k.bandwidth, "overhead": k.overhead}
             for kind, k in calibration.fit_kinds(objs).items()}
    result = {"link": name, "inter": {"alpha": link.alpha, "bandwidth": link.bandwidth, "overhead": link.overhead},
              "kinds": kinds,
              "fit_error": calibration.fit_error(link, objs), "samples": samples,
              "measured": date.today().isoformat()}
    (out / f"calibration-{name.replace(' ', '_')}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{name:24s} overhead {units.format_duration(link.overhead):>9s}  alpha "
          f"{units.format_duration(link.alpha):>9s}  bandwidth "
          f"{units.format_bandwidth(link.bandwidth):>12s}  median error {100 * result['fit_error']:.1f}%",
          flush=True)
    return result


def bench_row(n: int, flags: list[str], netns: Path | None, a) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        where = ["-H", PLACEMENT[n], "--network-interface", "tk0"] if netns and n > 1 else []
        launched([PY, "-m", "toolkit", "bench", "--np", str(n), "--gloo", *where, *MODEL, "--warmup", "3",
                  "--iters", str(a.iters), "--steps-per-iter", "3", "--out", tmp, "--quiet", *flags,
                  "--env", "OMP_NUM_THREADS=1"], netns if n > 1 else None, a.timeout + 60)
        row = json.loads((Path(tmp) / "bench.json").read_text())["rows"][0]
        return {**row, "step_s": 64 / row["per_worker"]}


class Burst:
    """A shaped namespace link as tc's token bucket makes it: what fits in the burst crosses at the
    unshaped link's cost (`free`), the rest at the shaped link's (the emulation's artefact: a NIC has
    no burst; small compressed payloads would otherwise be priced at 100 Mbit/s they never see)."""

    def __init__(self, shaped: wire.Link, free: wire.Link):
        self.shaped, self.free = shaped, free

    def cost(self, messages: float, nbytes: float) -> float:
        return (self.free if nbytes <= 2 * BURST else self.shaped).cost(messages, nbytes)


def predict(n: int, label: str, compute_s: float, one: dict, link: wire.Link, intra: wire.Link,
            free: wire.Link | None = None) -> float:
    from toolkit.config import Config
    from toolkit.planner import plan

    cfg = Config()
    name = label.split()[0]
    compression = one["compression_ms_per_step"] / 1000 if name in plan.EXCHANGES else None
    method = plan.methods(cfg, [name], one["shapes"], compression_s=compression)[0]
    values = [math.prod(s) for s in one["shapes"]]
    work = scaling.Workload(compute_s=compute_s, tensor_values=tuple(reversed(values)))
    per_host = max(int(h.split(":")[1]) for h in PLACEMENT[n].split(","))      # 1 at N=2: the ring crosses the link
    if free is not None:
        link = Burst(link, free)
    return scaling.step_time(work, method, scaling.Cluster(per_host, link, intra), n).step_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per collective and size (default 5)")
    p.add_argument("--rates", default="none,10gbit,1gbit,100mbit", help="link rates to calibrate (tc's units)")
    p.add_argument("--check-rates", default="1gbit,100mbit", help="link rates of the step check")
    p.add_argument("--iters", type=int, default=5, help="bench iterations of the step check (default 5)")
    p.add_argument("--repeats", type=int, default=3,
                   help="benches per step-check row, the median kept (default 3: steps on 2 shared cores vary)")
    p.add_argument("--out", default=str(ROOT / "runs" / "scaling"), help="calibration files (default runs/scaling)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--write-docs", action="store_true", help="put the tables into docs/SCALING.md")
    p.add_argument("--report-only", action="store_true",
                   help="predict again from the measurements saved in --out (calibration-*.json, steps.json)")
    a = p.parse_args()
    if a.worker:
        worker(a.worker, [int(s) for s in a.sizes.split(",")], a.rounds)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.report_only:
        fits = saved_fits(out)
        steps = json.loads((out / "steps.json").read_text())
    else:
        fits, steps = measure(a, out)
    text = report(fits, steps, a)
    print(text)
    if a.write_docs:
        common.write_between("SCALING.md", "calibration", text)
    return 0


def saved_fits(out: Path) -> dict:
    return {f["link"]: f for f in map(json.loads, map(Path.read_text, sorted(out.glob("calibration-*.json"))))}


def measure(a, out: Path) -> tuple[dict, dict]:
    started = time.time()
    rates = [r for r in a.rates.split(",") if r]
    fits = saved_fits(out) if not rates else {}         # --rates '': the step check alone, on the saved links
    for controller in ("gloo", "mpi") if rates else ():
        fits[f"{controller} loopback"] = fit_link(f"{controller} loopback",
                                                  time_collectives(2, controller, None, 1e12, a.rounds, a), out)
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Path(tmp) / "hosts"
        subprocess.run(["bash", str(SCRIPT), "up", str(hosts)], check=True, capture_output=True, timeout=300)
        try:
            for rate in rates:
                subprocess.run(["bash", str(SCRIPT), "shape", str(hosts), rate], check=True, timeout=60)
                cap = 1e12 if rate == "none" else 3 * units.parse_bandwidth(rate, "--rates") / 1.5
                samples = [s for n in (2, 3, 4) for s in time_collectives(n, "gloo", hosts, cap, a.rounds, a)]
                fits[f"veth {rate}"] = fit_link(f"veth {rate}", samples, out, shaped=rate != "none")
            subprocess.run(["bash", str(SCRIPT), "shape", str(hosts), "none"], check=True, timeout=60)
            ones = {label: bench_row(1, flags, None, a) for label, flags in METHODS}
            print(f"1 worker: {1000 * ones['none']['step_s']:.1f} ms a step", flush=True)
            # the compute N ranks get on 2 cores varies from run to run: the median of three benches
            compute = {n: statistics.median(bench_row(n, ["--sync", "local_sgd", "--local-steps", "1000000"],
                                                      hosts, a)["step_s"] for _ in range(3)) for n in (2, 3, 4)}
            print("compute with N ranks on this machine:", {n: f"{1000 * s:.1f} ms" for n, s in compute.items()})
            for rate in [r for r in a.check_rates.split(",") if r]:
                subprocess.run(["bash", str(SCRIPT), "shape", str(hosts), rate], check=True, timeout=60)
                for label, flags in METHODS:
                    for n in (2, 3, 4):
                        runs = [bench_row(n, flags, hosts, a)["step_s"] for _ in range(a.repeats)]
                        measured.append([rate, label, n, statistics.median(runs)])
                        print(f"{rate:8s} {label:16s} N={n}: measured {1000 * measured[-1][-1]:8.1f} ms", flush=True)
        finally:
            subprocess.run(["bash", str(SCRIPT), "down", str(hosts)], capture_output=True, timeout=120)
    steps = {"ones": ones, "compute": compute, "measured": measured, "minutes": (time.time() - started) / 60}
    (out / "steps.json").write_text(json.dumps(steps, indent=1) + "\n")
    return fits, steps


def report(fits: dict, steps: dict, a) -> str:
    intra = wire.Link(**fits["gloo loopback"]["inter"])
    compute = {int(n): s for n, s in steps["compute"].items()}
    one = steps["ones"]["none"]
    checks = {}
    for rate, label, n, measured in steps["measured"]:
        link = wire.Link(**fits[f"veth {rate}"]["inter"])
        free = wire.Link(**fits["veth none"]["inter"]) if rate != "none" else None
        checks[(rate, label, n)] = (predict(n, label, compute[n], steps["ones"][label], link, intra, free), measured)
    links = [[name, ", ".join(map(str, sorted({s["n"] for s in fit["samples"]}))),
              units.format_duration(fit["inter"]["overhead"]), units.format_duration(fit["inter"]["alpha"]),
              units.format_bandwidth(fit["inter"]["bandwidth"]), f"{100 * fit['fit_error']:.1f}%"]
             for name, fit in fits.items()]
    lines = [f"Measured {date.today().isoformat()} with `.venv/bin/python -m benchmarks.scaling_calibrate --rates "
             f"{a.rates or repr('')} --check-rates {a.check_rates} --repeats {a.repeats} --write-docs` "
             f"({steps['minutes']:.0f} min; {os.cpu_count()} cores, Horovod {common.horovod_version()}, torch CPU); "
             "`--report-only` recomputes the predictions from the saved measurements.", "",
             common.table(["link", "ranks", "overhead (per collective)", "alpha (per message)", "bandwidth",
                           "median fit error"], links)]
    lines += ["", f"Steps: MLP 3 x 1024 (3.2M parameters), batch 64 a rank; one worker "
                  f"{1000 * one['step_s']:.1f} ms; compute with N ranks sharing the 2 cores: "
              + ", ".join(f"N={n} {1000 * s:.1f} ms" for n, s in compute.items()) + ".", ""]
    errors, rows = [], []
    for (rate, label, n), (pred, meas) in checks.items():
        errors.append(abs(pred / meas - 1))
        rows.append([rate, label, n, f"{1000 * pred:.1f}", f"{1000 * meas:.1f}", f"{100 * (pred / meas - 1):+.0f}%"])
    lines.append(common.table(["link", "method", "ranks", "predicted ms", "measured ms", "error"], rows))
    if errors:
        lines += ["", f"Within 15%: {sum(e <= 0.15 for e in errors)} of {len(errors)}; median error "
                      f"{100 * statistics.median(errors):.0f}%, largest {100 * max(errors):.0f}%."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
