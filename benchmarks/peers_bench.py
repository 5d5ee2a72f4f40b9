"""The toolkit against its peers, and the Horovod tuning attempts, on one model; the tables behind docs/BENCHMARKS.md.

    .venv/bin/python -m benchmarks.peers_bench --suite peers --repeats 1        # ~8 min, print only
    .venv/bin/python -m benchmarks.peers_bench --write-docs        # peers + tuning, 3 rounds: 20+ min, into the doc
    .venv/bin/python -m benchmarks.peers_bench --suite overhead -np 1 --features 64 --hidden-size 64 --hidden-layers 1 --repeats 5
    .venv/bin/python -m benchmarks.peers_bench --suite resnet50 --image-size 64 --batch-size 16 --repeats 3
    .venv/bin/python -m benchmarks.peers_bench --suite engines --repeats 3 --warmup 5 --iters 4 --steps-per-iter 10 \
        --resnet-image-size 64 --resnet-batch-size 16 --resnet-warmup 2 --resnet-iters 2 --resnet-steps-per-iter 3

Every row times the same MLP (`--features` inputs, `--hidden-layers` x `--hidden-size`, 10 classes),
the same batch per worker and the same loop (warm-up steps, then timed iterations of several steps
on one fixed random batch), on `-np` workers with this host's cores shared between them. Rows run
in turns (`--repeats` rounds, so drift of the machine hits every row alike) and each row reports
the median over its rounds of the per-worker mean samples/sec.

- peers: (a) `toolkit bench` per framework, (b) a plain Horovod script (benchmarks/peers/, no toolkit
  code), (c) torch DDP under torchrun, (d) TF MultiWorkerMirroredStrategy, (e) plain Horovod MXNet,
  plus a plain Horovod TensorFlow script; the ratio column is throughput / (b)'s.
- tuning: the toolkit's torch step with each Horovod setting tried, against torch DDP in the same run.
- overhead: each framework's toolkit step against the plain Horovod script doing the same step (run it
  with one worker and a tiny model to see the per-step cost alone).
- resnet50: Horovod's headline benchmark: ResNet-50 (torchvision, keras.applications, Gluon's zoo) on
  random `--image-size` images, toolkit bench against the plain Horovod script of each framework, and
  torch DDP; the ratio is against the same framework's plain script.
- engines: torch on each engine, the toolkit against the plain script of that engine, for the MLP and
  for ResNet-50 (`--resnet-*`: its images, batch and steps), all eight rows in one alternating turn:
  (a) `toolkit bench --backend horovod` (horovodrun, Gloo) against (d) the plain Horovod script,
  (b) `toolkit bench --backend native` against (c) the plain DDP script, both under torchrun (Gloo).
  `toolkit bench` itself refuses `--backend native` (its parent launches Horovod jobs only), so (b)
  runs bench's per-rank half, `toolkit bench --worker-result FILE`, under torchrun directly.
  Rounds alternate their order (ABBA), so a row's place in a round does not favour it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from toolkit.planner.bench import summarize

ROOT = common.ROOT
PEERS = ROOT / "benchmarks" / "peers"
BIN = Path(sys.executable).parent


def toolkit(framework: str, controller: str = "gloo", flags: tuple = (), env: tuple = ()):
    def argv(a, out):
        extra = [f for item in env for f in ("--env", item)]
        extra += ["--dataset", "synthetic"] if a.model != "mlp" else []     # the ResNets read images
        return [str(BIN / "toolkit"), "bench", "--np", str(a.np), f"--{controller}", "--framework", framework,
                *model_flags(a), "--out", str(out), "--quiet", *extra, *flags], out / f"np{a.np}.json"
    return argv


def model_flags(a) -> list[str]:
    return ["--model", a.model, "--image-size", str(a.image_size), "--classes", str(a.classes),
            "--features", str(a.features), "--hidden-size", str(a.hidden_size), "--hidden-layers",
            str(a.hidden_layers), "--batch-size", str(a.batch_size), "--warmup", str(a.warmup),
            "--iters", str(a.iters), "--steps-per-iter", str(a.steps_per_iter)]


def horovodrun(script: str, controller: str = "gloo"):
    def argv(a, out):
        return [str(BIN / "horovodrun"), "-np", str(a.np), "-H", f"localhost:{a.np}", f"--{controller}",
                sys.executable, str(PEERS / script), *model_flags(a), "--result", str(out / "r.json")], out / "r.json"
    return argv


def torchrun(script: str):
    def argv(a, out):
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(a.np), str(PEERS / script),
                *model_flags(a), "--result", str(out / "r.json")], out / "r.json"
    return argv


def torchrun_toolkit(flags: tuple = ()):
    """`toolkit bench --backend native`'s per-rank half under torchrun: what bench's parent would launch
    (bench.worker_command: measure() on every rank, rank 0 writes the result), without that parent,
    which refuses backend native."""
    def argv(a, out):
        extra = ["--dataset", "synthetic"] if a.model != "mlp" else []
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(a.np), "-m", "toolkit", "bench",
                "--framework", "torch", "--backend", "native", *model_flags(a), "--quiet", *extra, *flags,
                "--worker-result", str(out / "r.json")], out / "r.json"
    return argv


def with_args(argv_fn, **changes):
    """The row run with some arguments changed (the engines suite's ResNet-50 rows: their model, images,
    batch and steps)."""
    def argv(a, out):
        return argv_fn(argparse.Namespace(**{**vars(a), **changes}), out)
    argv.changes = changes
    return argv


def tf_native(script: str):
    def argv(a, out):
        return [str(BIN / "toolkit"), "launch", "--backend", "native", "-np", str(a.np), "--timeout", "600", "--",
                sys.executable, str(PEERS / script), *model_flags(a), "--result", str(out / "r.json")], out / "r.json"
    return argv


# (key, label, how to run it, the key of the row its ratio is taken against)
PEER_ROWS = [
    ("b", "(b) plain Horovod script, torch, Gloo", horovodrun("horovod_torch_synthetic.py"), "b"),
    ("a", "(a) toolkit bench, torch, Gloo", toolkit("torch"), "b"),
    ("b-mpi", "(b) plain Horovod script, torch, MPI", horovodrun("horovod_torch_synthetic.py", "mpi"), "b"),
    ("a-mpi", "(a) toolkit bench, torch, MPI", toolkit("torch", "mpi"), "b"),
    ("c", "(c) torch DDP, torchrun, Gloo", torchrun("ddp_torch_synthetic.py"), "b"),
    ("a-tf", "(a) toolkit bench, TensorFlow (Keras 3), Gloo", toolkit("tensorflow"), "b"),
    ("tf", "plain Horovod script, TensorFlow (Keras 3), Gloo", horovodrun("horovod_tf_synthetic.py"), "b"),
    ("d", "(d) TF MultiWorkerMirroredStrategy (ring)", tf_native("mwms_tf_synthetic.py"), "b"),
    ("a-mx", "(a) toolkit bench, MXNet, Gloo", toolkit("mxnet"), "b"),
    ("e", "(e) plain Horovod script, MXNet, Gloo", horovodrun("horovod_mxnet_synthetic.py"), "b"),
]

TUNING_ROWS = [
    ("c", "torch DDP, torchrun, Gloo (the target)", torchrun("ddp_torch_synthetic.py"), "c"),
    ("t-gloo", "toolkit, Gloo, Horovod defaults", toolkit("torch", "gloo"), "c"),
    ("t-mpi", "toolkit, MPI controller + MPI operations", toolkit("torch", "mpi"), "c"),
    ("t-fus0", "toolkit, Gloo, fusion off (threshold 0)", toolkit("torch", flags=("--fusion-threshold-mb", "0")), "c"),
    ("t-fus8", "toolkit, Gloo, fusion threshold 8 MiB", toolkit("torch", flags=("--fusion-threshold-mb", "8")), "c"),
    ("t-cyc01", "toolkit, Gloo, cycle time 0.1 ms", toolkit("torch", flags=("--cycle-time-ms", "0.1")), "c"),
    ("t-cyc10", "toolkit, Gloo, cycle time 10 ms", toolkit("torch", flags=("--cycle-time-ms", "10")), "c"),
    ("t-auto", "toolkit, Gloo, HOROVOD_AUTOTUNE=1", toolkit("torch", env=("HOROVOD_AUTOTUNE=1",)), "c"),
    ("t-mpi-fus0", "toolkit, MPI, fusion off", toolkit("torch", "mpi", flags=("--fusion-threshold-mb", "0")), "c"),
    ("t-mpi-cyc01", "toolkit, MPI, cycle time 0.1 ms", toolkit("torch", "mpi", flags=("--cycle-time-ms", "0.1")), "c"),
]

# The fusion buffer, the setting that mattered in the tuning table, across sizes (Gloo and MPI).
FUSION_ROWS = [
    ("c", "torch DDP, torchrun, Gloo (25 MiB buckets)", torchrun("ddp_torch_synthetic.py"), "c"),
    *[(f"g{mb}", f"toolkit, Gloo, fusion threshold {mb} MiB", toolkit("torch", flags=("--fusion-threshold-mb", mb)), "c")
      for mb in ("128", "32", "16", "8", "4")],
    *[(f"m{mb}", f"toolkit, MPI, fusion threshold {mb} MiB", toolkit("torch", "mpi", flags=("--fusion-threshold-mb", mb)),
       "c") for mb in ("128", "8")],
]

# Horovod's headline benchmark (ResNet-50, synthetic images): each toolkit row against its framework's plain script.
RESNET_ROWS = [
    ("b", "plain Horovod script, torch (torchvision)", horovodrun("horovod_torch_synthetic.py"), "b"),
    ("a", "toolkit bench, torch", toolkit("torch"), "b"),
    ("a-ng", "toolkit bench, torch, --no-nan-guard", toolkit("torch", flags=("--no-nan-guard",)), "b"),
    ("c", "torch DDP, torchrun, Gloo", torchrun("ddp_torch_synthetic.py"), "b"),
    ("tf", "plain Horovod script, TensorFlow (keras.applications)", horovodrun("horovod_tf_synthetic.py"), "tf"),
    ("a-tf", "toolkit bench, TensorFlow", toolkit("tensorflow"), "tf"),
    ("a-tf-ng", "toolkit bench, TensorFlow, --no-nan-guard", toolkit("tensorflow", flags=("--no-nan-guard",)), "tf"),
    ("e", "plain Horovod script, MXNet (Gluon model zoo)", horovodrun("horovod_mxnet_synthetic.py"), "e"),
    ("a-mx", "toolkit bench, MXNet", toolkit("mxnet"), "e"),
    ("a-mx-ng", "toolkit bench, MXNet, --no-nan-guard", toolkit("mxnet", flags=("--no-nan-guard",)), "e"),
]

# The toolkit's own cost per step: each toolkit row against the plain script doing the same.
OVERHEAD_ROWS = [
    ("b", "plain Horovod script, torch", horovodrun("horovod_torch_synthetic.py"), "b"),
    ("a", "toolkit bench, torch", toolkit("torch"), "b"),
    ("tf", "plain Horovod script, TensorFlow", horovodrun("horovod_tf_synthetic.py"), "tf"),
    ("a-tf", "toolkit bench, TensorFlow", toolkit("tensorflow"), "tf"),
    ("e", "plain Horovod script, MXNet", horovodrun("horovod_mxnet_synthetic.py"), "e"),
    ("a-mx", "toolkit bench, MXNet", toolkit("mxnet"), "e"),
]


# torch's own engine against Horovod: each toolkit row against the plain script of its engine.
ENGINE_ROWS = [
    ("d", "(d) plain Horovod script, horovodrun, Gloo", horovodrun("horovod_torch_synthetic.py"), "d"),
    ("a", "(a) toolkit bench --backend horovod, horovodrun, Gloo", toolkit("torch"), "d"),
    ("c", "(c) plain DDP script, torchrun, Gloo", torchrun("ddp_torch_synthetic.py"), "c"),
    ("b", "(b) toolkit bench --backend native (DDP), torchrun, Gloo", torchrun_toolkit(), "c"),
]


def engine_rows(a) -> list:
    """ENGINE_ROWS for the MLP, then for ResNet-50 with the --resnet-* arguments (keys prefixed `r`)."""
    resnet = dict(model="resnet50", image_size=a.resnet_image_size, batch_size=a.resnet_batch_size,
                  warmup=a.resnet_warmup, iters=a.resnet_iters, steps_per_iter=a.resnet_steps_per_iter)
    mlp = [(key, f"MLP {label}", with_args(fn, model="mlp"), ref) for key, label, fn, ref in ENGINE_ROWS]
    return mlp + [(f"r{key}", f"ResNet-50 {label}", with_args(fn, **resnet), f"r{ref}")
                  for key, label, fn, ref in ENGINE_ROWS]


def run_row(argv_fn, a, timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        argv, result = argv_fn(a, Path(tmp))
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if proc.returncode != 0 or not result.is_file():
            tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
            return {"failed": f"exit {proc.returncode}: {' / '.join(tail)[-300:]}"}
        return {**summarize(json.loads(result.read_text())), "wall_s": time.perf_counter() - t0}


def measure(rows, a, alternate: bool = False) -> dict[str, list[dict]]:
    """Every row once per round; `alternate`: every other round in the reverse order (ABBA)."""
    results: dict[str, list[dict]] = {key: [] for key, _, _, _ in rows}
    for round_ in range(a.repeats):
        for key, label, fn, _ in (rows[::-1] if alternate and round_ % 2 else rows):
            out = run_row(fn, a, a.timeout)
            results[key].append(out)
            shown = out.get("failed") or f"{out['per_worker']:8.1f} samples/s per worker  ({out['wall_s']:.0f} s)"
            print(f"round {round_ + 1}  {label:50s} {shown}", file=sys.stderr, flush=True)
    return results


def median_row(outs: list[dict]) -> dict | None:
    ok = [o for o in outs if "failed" not in o]
    if not ok:
        return None
    mid = sorted(ok, key=lambda o: o["per_worker"])[(len(ok) - 1) // 2]
    return {**mid, "rounds": [o["per_worker"] for o in ok], "failed_rounds": len(outs) - len(ok)}


def table(rows, results, a, ratio_name: str) -> str:
    """Medians per row; the ratio of throughputs and the step-time difference against the row's reference."""
    lines = []
    for key, label, fn, ref in rows:
        m, base = median_row(results[key]), median_row(results[ref])
        if m is None:
            lines.append(f"| {label} | failed: {results[key][-1]['failed'].replace('|', '/')} | | | | |")
            continue
        batch = getattr(fn, "changes", {}).get("batch_size", a.batch_size)
        step = 1000 * batch / m["per_worker"]
        ratio = f"{m['per_worker'] / base['per_worker']:.3f}" if base else "n/a"
        delta = f"{step - 1000 * batch / base['per_worker']:+.3f}" if base else "n/a"
        rounds = ", ".join(f"{r:,.0f}" for r in m["rounds"])
        lines.append([label, f"{m['per_worker']:,.1f} +- {m['spread']:,.1f}", rounds, f"{step:.3f}", ratio, delta])
    return common.table(["row", "samples/s per worker (median of rounds)", "rounds", "step ms", ratio_name,
                         "step ms vs it"], lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("peers", "tuning", "fusion", "overhead", "resnet50", "engines"), action="append",
                   help="which table(s), repeatable (default: peers and tuning)")
    p.add_argument("-np", dest="np", type=int, default=2, help="workers per job (default 2)")
    p.add_argument("--model", default="mlp", help="mlp, or resnet50 (the resnet50 suite sets it)")
    p.add_argument("--image-size", type=int, default=224, help="ResNet-50: side of the random images (default 224)")
    p.add_argument("--classes", type=int, default=10, help="classes of the random labels (default 10)")
    p.add_argument("--features", type=int, default=1024, help="MLP input width (default 1024)")
    p.add_argument("--hidden-size", type=int, default=2048, help="MLP hidden width (default 2048)")
    p.add_argument("--hidden-layers", type=int, default=3, help="MLP hidden layers (default 3)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per step (default 32)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per round (default 5)")
    p.add_argument("--steps-per-iter", type=int, default=10, help="steps per timed iteration (default 10)")
    p.add_argument("--resnet-image-size", type=int, default=64, help="engines: ResNet-50's image side (default 64)")
    p.add_argument("--resnet-batch-size", type=int, default=16, help="engines: ResNet-50's batch per worker "
                   "(default 16)")
    p.add_argument("--resnet-warmup", type=int, default=3, help="engines: ResNet-50's warm-up steps (default 3)")
    p.add_argument("--resnet-iters", type=int, default=3, help="engines: ResNet-50's timed iterations (default 3)")
    p.add_argument("--resnet-steps-per-iter", type=int, default=5, help="engines: ResNet-50's steps per iteration "
                   "(default 5)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all rows; each row reports its median "
                   "(default 3)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per job (default 600)")
    p.add_argument("--write-docs", action="store_true",
                   help="also write the tables into docs/BENCHMARKS.md (default: print them only)")
    a = p.parse_args()
    suites = [("peers", PEER_ROWS, "x (b) throughput"), ("tuning", TUNING_ROWS, "x DDP throughput"),
              ("fusion", FUSION_ROWS, "x DDP throughput"),
              ("overhead", OVERHEAD_ROWS, "x plain script throughput"),
              ("resnet50", RESNET_ROWS, "x plain Horovod script (same framework)"),
              ("engines", None, "x plain script of its engine")]
    failed = False
    for name, rows, ratio in suites:
        if name not in (a.suite or ["peers", "tuning"]):
            continue
        if name == "resnet50":
            a.model = "resnet50"
        if name == "engines":     # both models, whatever --model or an earlier suite set
            a.model = "mlp"
            rows = engine_rows(a)
        results = measure(rows, a, alternate=name == "engines")
        failed |= any("failed" in o for outs in results.values() for o in outs)
        params = ((a.features + 1) * a.hidden_size + (a.hidden_layers - 1) * (a.hidden_size + 1) * a.hidden_size
                  + (a.hidden_size + 1) * 10)
        shape = (f"--image-size {a.image_size} --classes {a.classes}" if a.model != "mlp" else
                 f"--features {a.features} --hidden-size {a.hidden_size} --hidden-layers {a.hidden_layers}")
        resnet = (f" --resnet-image-size {a.resnet_image_size} --resnet-batch-size {a.resnet_batch_size} "
                  f"--resnet-warmup {a.resnet_warmup} --resnet-iters {a.resnet_iters} "
                  f"--resnet-steps-per-iter {a.resnet_steps_per_iter}" if name == "engines" else "")
        command = (f"`.venv/bin/python -m benchmarks.peers_bench --suite {name} -np {a.np} {shape} "
                   f"--batch-size {a.batch_size} --repeats {a.repeats} --warmup {a.warmup} "
                   f"--iters {a.iters} --steps-per-iter {a.steps_per_iter}{resnet} --write-docs`")
        model = (f"{a.model} on random {a.image_size}x{a.image_size} images, {a.classes} classes" if a.model != "mlp"
                 else f"MLP {a.features} -> {a.hidden_layers} x {a.hidden_size} -> 10 ({params / 1e6:.2f}M parameters)")
        if name == "engines":
            model = (f"{model}, batch {a.batch_size} per worker, {a.warmup} warm-up steps, {a.iters} x "
                     f"{a.steps_per_iter} timed steps per round; ResNet-50 (torchvision) on random "
                     f"{a.resnet_image_size}x{a.resnet_image_size} images, {a.classes} classes, batch "
                     f"{a.resnet_batch_size} per worker, {a.resnet_warmup} warm-up steps, {a.resnet_iters} x "
                     f"{a.resnet_steps_per_iter} timed steps per round; {a.np} workers, SGD with momentum; "
                     f"rounds in alternating order (ABBA)")
        else:
            model = (f"{model}, batch {a.batch_size} per worker, {a.np} workers, {a.warmup} warm-up steps, "
                     f"{a.iters} x {a.steps_per_iter} timed steps per round")
        text = f"Made by {command} on {common.machine()}. {model}.\n\n" + table(rows, results, a, ratio)
        print(text)
        if a.write_docs:
            common.write_between("BENCHMARKS.md", name, text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
