"""The GPU check: one short visit to a machine with one GPU, torch preinstalled and no package index
answers whether the toolkit's step keeps up with a plain torch loop there, and prints one table.

    .venv/bin/python -m benchmarks.gpu_check --fetch-carry .carry     # here (needs the index): what to carry
    python3 -m benchmarks.gpu_check --carry .carry --out DIR          # there, from the repo root: ~8 min
    .venv/bin/python -m benchmarks.gpu_check --dry-run                # here, on the CPU: the same code, tiny shapes

What it does, each stage inside one deadline (`--minutes`, 9):
1. the machine: Python, torch, CUDA, the GPU; the toolkit installed from this checkout (`pip install
   --no-deps --no-build-isolation -e .`) and the carried wheels the machine lacks (`--no-index`);
2. Horovod: used if `horovod.torch` imports with NCCL, else built for this torch with NCCL from the
   carried sdist (`toolkit build-horovod --gpus --no-mpi --frameworks torch --sdist ...`); without one,
   the Horovod rows say why and the native rows still run. The dry run prints the build's plan
   (`--explain`) instead of building (a CPU build takes 10-15 min);
3. the step, one process per (backend, model): the same model, batch, optimizer (SGD, momentum 0.9)
   and bf16 autocast twice, once through the toolkit (`toolkit.start`, `session.setup`,
   `session.backward` + `session.step`) and once as a plain torch loop, in alternating timed blocks
   (ABBA, medians); steps/s of each and the ratio; host syncs per step, counted by
   benchmarks/syncs.py and, on a GPU, by `torch.cuda.set_sync_debug_mode("warn")`; the peak memory
   a block adds. Models: torchvision's ResNet-50 (224x224 images, batch 64) and the toolkit's
   transformer LM (12 x 768, 512 tokens, batch 16); the dry run shrinks both;
4. the exchange kernels: bf16 and int8 compress + decompress-and-add of 100 MB on the device
   (toolkit/exchange/compression.py on torch tensors), ms.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT
SDIST = "horovod-{version}.tar.gz"
BACKENDS = ("horovod", "native")
# the model's shape and batch on a GPU; --dry-run's on the CPU
MODELS = {
    "resnet50": {"gpu": {"batch": 64, "image": 224}, "dry": {"batch": 2, "image": 16}},
    "transformer_lm": {"gpu": {"batch": 16, "context": 512, "width": 768, "depth": 12, "heads": 12, "vocab": 32768},
                       "dry": {"batch": 2, "context": 16, "width": 32, "depth": 2, "heads": 2, "vocab": 64}},
}
# what the GPU image lacks that Horovod needs at run time (its other needs are there), for --fetch-carry
CARRIED_WHEELS = ("cffi", "pycparser")


def say(line: str) -> None:
    print(f"gpu_check: {line}", file=sys.stderr, flush=True)


# -- stage 1: the machine ---------------------------------------------------------------------------

def machine() -> dict:
    import torch
    gpu = torch.cuda.is_available()
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if gpu else None, "date": common.today()}


def install(carry: Path | None) -> None:
    """The toolkit from this checkout, and the carried wheels whose distribution is missing here."""
    if importlib.util.find_spec("toolkit.adapters") is None:
        pip("install", "-q", "--no-deps", "--no-build-isolation", "-e", str(ROOT))
    for wheel in sorted(carry.glob("*.whl")) if carry else []:
        name = wheel.name.split("-")[0].replace("_", "-")
        if subprocess.run([sys.executable, "-m", "pip", "show", "-q", name], capture_output=True).returncode:
            pip("install", "-q", "--no-index", "--no-deps", str(wheel))


def pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"gpu_check: pip {' '.join(args[:2])} failed: {proc.stdout[-800:]}{proc.stderr[-800:]}")


def fetch_carry(folder: Path) -> None:
    """Here, with the package index: the Horovod sdist and the wheels the GPU image lacks, for Python
    3.12 on x86-64 (the GPU machine's)."""
    from toolkit.install import pins
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", p)]
    pip("download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(folder), f"horovod=={pins.HOROVOD}")
    pip("download", "-q", "--no-deps", "--only-binary", ":all:", "--python-version", "3.12", "--implementation",
        "cp", *platforms, "-d", str(folder), *CARRIED_WHEELS)
    total = sum(p.stat().st_size for p in folder.iterdir())
    say(f"{folder}: {', '.join(sorted(p.name for p in folder.iterdir()))} ({total / 2**20:.1f} MiB)")


# -- stage 2: Horovod -------------------------------------------------------------------------------

def horovod_status() -> str | None:
    """None when horovod.torch imports and can reduce this machine's tensors, else why not."""
    probe = ("import torch, horovod.torch as hvd; "
             "print('ok' if not torch.cuda.is_available() or hvd.nccl_built() else 'built without NCCL')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if proc.returncode:
        return "horovod.torch does not import: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
    return None if proc.stdout.strip() == "ok" else proc.stdout.strip()


def horovod(carry: Path | None, dry_run: bool, seconds: float) -> str | None:
    """Horovod ready for the step (None), or why not."""
    why = horovod_status()
    command = [sys.executable, "-m", "toolkit", "build-horovod", "--gpus", "--no-mpi", "--frameworks", "torch"]
    from toolkit.install import pins
    sdist = carry / SDIST.format(version=pins.HOROVOD) if carry else None
    if dry_run:
        plan = subprocess.run(command + ["--explain"], capture_output=True, text=True, timeout=120)
        if plan.returncode:
            raise SystemExit(f"gpu_check: the build's plan failed: {plan.stderr[-800:]}")
        say("dry run: the GPU machine builds with `" + " ".join(command[1:]) + " --sdist SDIST`; its plan here:\n"
            + plan.stdout.strip())
        return why
    if why is None:
        return None
    if sdist is None or not sdist.is_file():
        return f"{why}; no Horovod sdist carried ({sdist or '--carry DIR'})"
    say(f"building Horovod with NCCL ({why}); at most {seconds / 60:.0f} min")
    try:
        proc = subprocess.run(command + ["--sdist", str(sdist)], capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return f"the Horovod build ran past {seconds / 60:.0f} min"
    if proc.returncode:
        return "the Horovod build failed: " + " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    return horovod_status()


# -- stage 3: the step (one worker process per backend and model) -----------------------------------

def build(name: str, shape: dict):
    """(model, inputs, targets, loss) on the CPU, made from seed 0."""
    import torch
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50(weights=None, num_classes=1000)
        x = torch.randn(shape["batch"], 3, shape["image"], shape["image"])
        y = torch.randint(0, 1000, (shape["batch"],))
        return model, x, y, torch.nn.functional.cross_entropy
    from toolkit.adapters.torch.models import TransformerLM
    model = TransformerLM(shape["vocab"], shape["width"], shape["depth"], shape["heads"], shape["context"])
    ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["context"] + 1))

    def loss(logits, target):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    return model, ids[:, :-1], ids[:, 1:], loss


def worker(a) -> dict:
    import torch

    import toolkit
    from benchmarks.syncs import SyncCounter
    shape = MODELS[a.model]["dry" if a.dry_run else "gpu"]
    session = toolkit.start(framework="torch", backend=a.backend, precision="bf16", batch_size=shape["batch"],
                            lr=0.01, momentum=0.9, seed=0)
    device = session.torch_device
    net, x, y, loss_fn = build(a.model, shape)
    plain = copy.deepcopy(net).to(device)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    model, _ = session.setup(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
    x, y = x.to(device), y.to(device)
    cuda = device.type == "cuda"

    def toolkit_steps(n):
        for _ in range(n):
            with session.autocast():
                loss = loss_fn(model(x), y)
            session.backward(loss)
            session.step()

    def plain_steps(n):
        for _ in range(n):
            plain_opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = loss_fn(plain(x), y)
            loss.backward()
            plain_opt.step()

    def block(steps):
        steps(a.steps)
        if cuda:
            torch.cuda.synchronize()

    loops = {"toolkit": toolkit_steps, "plain": plain_steps}
    seconds = common.alternating({name: (lambda steps=steps: block(steps)) for name, steps in loops.items()},
                                 a.rounds)
    rates = {name: [a.steps / t for t in times] for name, times in seconds.items()}
    out = {"backend": a.backend, "model": a.model, "device": str(device), "path": session.path, "batch": shape["batch"],
           "nan_check_every": session.config.nan_check_every}
    for name, steps in loops.items():
        counter = SyncCounter()
        with counter:
            block(steps)
        out[f"{name}_steps_per_s"] = statistics.median(rates[name])
        out[f"{name}_syncs_per_step"] = sum(counter.calls.values()) / a.steps
        out[f"{name}_sync_calls"] = counter.calls
        if cuda:
            import warnings
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                block(steps)
            torch.cuda.set_sync_debug_mode("default")
            out[f"{name}_cuda_syncs_per_step"] = sum("synchroniz" in str(w.message) for w in seen) / a.steps
            out[f"{name}_peak_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
    out["ratio"] = out["toolkit_steps_per_s"] / out["plain_steps_per_s"]
    out["toolkit_steps_taken"] = session.global_step          # the session's own count: its loop really ran
    session.close()
    return out


def run_worker(backend: str, model: str, a, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "out.json"
        argv = [sys.executable, "-m", "benchmarks.gpu_check", "--worker", "--backend", backend, "--model", model,
                "--steps", str(a.steps), "--rounds", str(a.rounds), "--result", str(result)]
        argv += ["--dry-run"] if a.dry_run else []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        try:
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds, env=env)
        except subprocess.TimeoutExpired:
            return {"backend": backend, "model": model, "failed": f"ran past {seconds:.0f} s"}
        if proc.returncode or not result.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"backend": backend, "model": model, "failed": f"exit {proc.returncode}: {last}"}
        return json.loads(result.read_text())


# -- stage 4: the exchange kernels ------------------------------------------------------------------

def kernels(dry_run: bool) -> list[dict]:
    """bf16 and int8: compress, then decompress-and-add, of 100 MB of float32 on the device; ms per
    100 MB (the dry run times 1 MB and scales)."""
    import torch

    from toolkit.exchange import arrays, compression
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ops = arrays.Torch(device)
    n = 250_000 if dry_run else 25_000_000
    flat = torch.randn(n, device=device)
    total = torch.zeros(n, device=device)
    rows = []
    for name in ("bf16", "int8"):
        codec = compression.make(name, ops=ops)
        times = {"compress": [], "add": []}
        for rep in range(6):
            ops.synchronize()
            t0 = time.perf_counter()
            payload = codec.compress(flat)
            ops.synchronize()
            t1 = time.perf_counter()
            codec.add_into(total, payload, n)
            ops.synchronize()
            if rep:                                                    # the first: buffers allocated
                times["compress"].append(t1 - t0)
                times["add"].append(time.perf_counter() - t1)
        scale = 1000 * 25_000_000 / n
        rows.append({"method": name, "device": str(device),
                     "compress_ms_per_100mb": statistics.median(times["compress"]) * scale,
                     "add_ms_per_100mb": statistics.median(times["add"]) * scale})
    return rows


# -- the table --------------------------------------------------------------------------------------

def table(steps: list[dict], kernel_rows: list[dict]) -> str:
    def f(row, key, fmt="{:.2f}"):
        return fmt.format(row[key]) if row.get(key) is not None else "-"
    rows = []
    for r in steps:
        if "failed" in r:
            rows.append(f"| {r['model']} | {r['backend']} | failed: {r['failed']} | | | | | |")
            continue
        syncs = f"{r['toolkit_syncs_per_step']:.2f} / {r['plain_syncs_per_step']:.2f}"
        cuda_syncs = (f"{r['toolkit_cuda_syncs_per_step']:.2f} / {r['plain_cuda_syncs_per_step']:.2f}"
                      if "toolkit_cuda_syncs_per_step" in r else "-")
        memory = (f"{r['toolkit_peak_gib']:.2f} / {r['plain_peak_gib']:.2f}" if "toolkit_peak_gib" in r else "-")
        rows.append([r["model"], r["backend"], f(r, "toolkit_steps_per_s"), f(r, "plain_steps_per_s"),
                     f"{r['ratio']:.3f}", syncs, cuda_syncs, memory])
    step_table = common.table(["model", "backend", "toolkit steps/s", "plain steps/s", "toolkit / plain",
                               "host reads per step (toolkit / plain)", "CUDA syncs per step (toolkit / plain)",
                               "peak GiB a block adds (toolkit / plain)"], rows)
    kernel_table = common.table(["exchange kernel", "device", "compress ms per 100 MB", "decompress + add ms per 100 MB"],
                                [[k["method"], k["device"], f"{k['compress_ms_per_100mb']:.2f}",
                                  f"{k['add_ms_per_100mb']:.2f}"] for k in kernel_rows])
    return step_table + "\n\n" + kernel_table


def waited(steps: list[dict]) -> list[str]:
    """The rows whose toolkit step read from the device or synchronized with it (host reads counted, CUDA's sync
    debug mode's warnings) more than the NaN guard's one read every `nan_check_every` steps: any fails the check,
    as a failed row does."""
    def over(row, key):
        return row.get(key, 0) > 1 / row["nan_check_every"] + 1e-9
    return [f"{r['model']} on {r['backend']}" for r in steps if "failed" not in r and
            (over(r, "toolkit_syncs_per_step") or over(r, "toolkit_cuda_syncs_per_step"))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="on the CPU: tiny shapes, the build's plan instead of a build")
    p.add_argument("--carry", type=Path, default=None, help="the folder carried beside the checkout (--fetch-carry's)")
    p.add_argument("--fetch-carry", type=Path, default=None, metavar="DIR",
                   help="here, with the package index: download the Horovod sdist and wheels to carry into DIR, exit")
    p.add_argument("--out", type=Path, default=None, help="write table.md and results.json here")
    p.add_argument("--minutes", type=float, default=9.0, help="the deadline for everything (default 9)")
    p.add_argument("--steps", type=int, default=None, help="steps per timed block (default 20; dry run 1)")
    p.add_argument("--rounds", type=int, default=None, help="timed blocks per loop (default 4; dry run 2)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of horovod,native")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    a.steps = a.steps or (1 if a.dry_run else 20)
    a.rounds = a.rounds or (2 if a.dry_run else 4)
    if a.worker:
        a.result.write_text(json.dumps(worker(a)))
        return 0
    if a.fetch_carry:
        fetch_carry(a.fetch_carry)
        return 0
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    for name, given, known in (("--models", models, MODELS), ("--backends", backends, BACKENDS)):
        if not given or set(given) - set(known):
            raise SystemExit(f"gpu_check: {name} takes a comma-separated subset of {','.join(known)}")
    deadline = time.monotonic() + 60 * a.minutes
    install(a.carry)
    facts = machine()
    if not facts["gpu"] and not a.dry_run:
        raise SystemExit("gpu_check: torch sees no GPU here; on a CPU run it with --dry-run")
    say(f"{facts['date']}: Python {facts['python']}, torch {facts['torch']}, CUDA {facts['cuda']}, "
        f"{facts['gpu'] or 'no GPU (dry run)'}")
    why = horovod(a.carry, a.dry_run, max(60.0, deadline - time.monotonic() - 240))
    steps = []
    for backend in backends:
        for model in models:
            if backend == "horovod" and why:
                steps.append({"backend": backend, "model": model, "failed": why})
                continue
            left = deadline - time.monotonic()
            if left < 30:
                steps.append({"backend": backend, "model": model, "failed": "no time left before the deadline"})
                continue
            say(f"{model} on {backend} ...")
            steps.append(run_worker(backend, model, a, left))
    kernel_rows = kernels(a.dry_run)
    text = (f"GPU check, {facts['date']}: {facts['gpu'] or 'CPU (dry run)'}, torch {facts['torch']}, "
            f"Python {facts['python']}; `python -m benchmarks.gpu_check{' --dry-run' if a.dry_run else ''}`\n\n"
            + table(steps, kernel_rows))
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "table.md").write_text(text + "\n")
        (a.out / "results.json").write_text(json.dumps({"machine": facts, "horovod": why or "ready", "steps": steps,
                                                        "kernels": kernel_rows}, indent=1))
    synced = waited(steps)
    if synced:
        print(f"gpu_check: the toolkit's step waited for the device in {', '.join(synced)} (the table's sync "
              "columns)", file=sys.stderr)
    return 1 if synced or any("failed" in r for r in steps if r["backend"] != "horovod" or not why) else 0


if __name__ == "__main__":
    sys.exit(main())
