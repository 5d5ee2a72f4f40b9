"""The support table of docs/INSTALL.md: every row of toolkit/install/support.py SUPPORT checked in a fresh virtualenv.

    make support                                              # every row, then the table into docs/INSTALL.md
    .venv/bin/python -m benchmarks.support_matrix --only py3.11-torch2.13.0 [--write-docs]

A row, as a user who already has an environment would do it: `python -m venv`; `pip install` of the
framework at the row's version and of the toolkit's wheel (built once here with `python -m build`);
`toolkit build-horovod` with no --frameworks (it builds for what it finds, installs what Horovod needs
at run time, verifies; its wheel is cached under ~/.cache/toolkit/horovod, so a row seen before takes
the cache); `toolkit doctor --framework F` must say ready; then a 2-rank job with plain `horovodrun -np
2 --gloo` of the examples a user copies (examples/your_torch.py, your_mxnet.py, your_keras.py for Keras
3, keras_fit.py --keras tf_keras for tf-keras), run from a folder outside the checkout so that `import
toolkit` is the installed wheel: its replicas must end identical. tests/test_install.py runs the first row
(the CPU torch 2.13.0 wheel) in the suite with these same functions.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolkit.install import support

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOC = "INSTALL.md"


def find_python(version: str) -> str:
    """`python3.12` on PATH if it runs, else pyenv's (this host's 3.12 is not on the default PATH)."""
    candidates = [shutil.which(f"python{version}")] + sorted(
        str(p) for p in Path(os.path.expanduser("~/.pyenv/versions")).glob(f"{version}.*/bin/python{version}"))
    for python in filter(None, candidates):
        proc = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return python
    raise SystemExit(f"no Python {version} found (PATH, ~/.pyenv/versions)")


def clean_env(venv: Path | None = None) -> dict:
    """This process's environment without the checkout's traces (PYTHONPATH, another virtualenv); `venv` first
    on PATH."""
    env = {k: v for k, v in os.environ.items() if k == "TOOLKIT_CACHE_DIR"
           or (k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("TOOLKIT_"))}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


def run(cmd, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def build_dist(out: Path, python: str = sys.executable, check: bool = True) -> tuple[Path, Path]:
    """The toolkit's sdist and wheel (`python -m build`, the wheel made from the sdist, no isolation: this
    environment's pinned setuptools), checked by `twine check --strict` (`check`). Returns (wheel, sdist)."""
    shutil.rmtree(out, ignore_errors=True)
    proc = run([python, "-m", "build", "--no-isolation", "--outdir", out, ROOT], ROOT, clean_env(), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    wheel, sdist = next(out.glob("*.whl")), next(out.glob("*.tar.gz"))
    checked = run([python, "-m", "twine", "check", "--strict", wheel, sdist], ROOT, clean_env(), 120) if check else None
    if checked is not None and checked.returncode != 0:
        raise RuntimeError(f"twine check failed:\n{checked.stdout}\n{checked.stderr}")
    return wheel, sdist


def make_env(row: support.Row, wheel: Path, venv: Path) -> float:
    """A fresh virtualenv on the row's Python with its framework and the toolkit's wheel. Returns seconds."""
    start = time.monotonic()
    python = find_python(row.python)
    steps = [([python, "-m", "venv", venv], 120),
             ([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
               wheel, *row.requirements], 1800)]
    if row.no_deps:
        steps.append(([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                       "--no-deps", *row.no_deps], 600))
    for cmd, timeout in steps:
        proc = run(cmd, venv.parent, clean_env(), timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(map(str, cmd[:6]))} ...` failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.monotonic() - start


def toolkit(venv: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`toolkit ARGS` of the virtualenv, from a folder outside the checkout."""
    return run([venv / "bin" / "toolkit", *args], venv.parent, clean_env(venv), timeout)


JOBS = {   # (framework, keras) -> the example a user copies, and its arguments
    ("torch", ""): ("your_torch.py",),
    ("mxnet", ""): ("your_mxnet.py",),
    ("tensorflow", "keras3"): ("your_keras.py",),
    ("tensorflow", "tf_keras"): ("keras_fit.py", "--keras", "tf_keras", "--epochs", "5"),
}


def job(venv: Path, framework: str, keras: str = "", timeout: float = 600) -> dict:
    """`horovodrun -np 2 --gloo python examples/<the example>` with the virtualenv's Python and horovodrun;
    returns rank 0's JSON line with `seconds` added; raises with the output's tail when it fails."""
    example, *args = JOBS[(framework, keras)]
    start = time.monotonic()
    proc = run([venv / "bin" / "horovodrun", "-np", "2", "--gloo", venv / "bin" / "python", EXAMPLES / example,
                *args], venv.parent, clean_env(venv), timeout)
    lines = [ln.split("]<stdout>:", 1)[-1] for ln in proc.stdout.splitlines()]
    found = [json.loads(ln) for ln in lines if ln.startswith("{")]
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"horovodrun {example} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {**found[-1], "seconds": time.monotonic() - start}


def check_row(row: support.Row, wheel: Path, work: Path, say=print) -> dict:
    """Every step of one row; the result's fields are the table's columns. Stops at the first failure
    (`failed`: which step, and why in one line)."""
    venv = work / row.name
    shutil.rmtree(venv, ignore_errors=True)        # fresh, also with --keep
    out: dict = {"row": row}
    try:
        out["install_s"] = make_env(row, wheel, venv)
        where = run([venv / "bin" / "python", "-c", "import toolkit; print(toolkit.__file__)"], work,
                    clean_env(venv), 60).stdout.strip()
        if not where.startswith(str(venv)):
            raise RuntimeError(f"`import toolkit` found {where}, not the installed wheel")
        say(f"{row.name}: installed in {out['install_s']:.0f} s")
        start = time.monotonic()
        built = toolkit(venv, "build-horovod", timeout=3600)
        out["build_s"], out["build_log"] = time.monotonic() - start, built.stdout + built.stderr
        if built.returncode != 0:
            raise RuntimeError("build-horovod: " + (built.stderr.strip().splitlines() or ["failed"])[-1])
        out["cached"] = "installing cached wheel" in built.stdout or "already installed" in built.stdout
        say(f"{row.name}: build-horovod {'from the cache' if out['cached'] else 'built'} in {out['build_s']:.0f} s")
        doctor = toolkit(venv, "doctor", "--framework", row.framework, timeout=600)
        out["doctor"] = doctor.stdout
        if doctor.returncode != 0:
            raise RuntimeError("doctor: " + doctor.stdout.strip().splitlines()[-1])
        out["jobs"] = {}
        for keras in row.keras or ("",):
            result = job(venv, row.framework, keras)
            if len(set(result["final_digests"])) != 1:
                raise RuntimeError(f"{keras or row.framework}: replicas differ: {result['final_digests']}")
            out["jobs"][keras] = result
            say(f"{row.name}: 2 ranks {keras} accuracy {result['accuracy']:.3f} in {result['seconds']:.0f} s")
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        out["failed"] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        out["detail"] = str(e)
        say(f"{row.name}: FAILED: {out['failed']}")
    return out


RESULTS = ROOT / "runs" / "support" / "results.json"   # every row's last result, kept between runs


def record(result: dict, path: Path = RESULTS) -> dict:
    """Merge one row's result (its columns, not the build log) into `path`; returns every row's last result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    every = json.loads(path.read_text()) if path.exists() else {}
    row: support.Row = result["row"]
    every[row.name] = {k: v for k, v in result.items() if k not in ("row", "build_log", "doctor", "detail")}
    every[row.name]["date"] = time.strftime("%Y-%m-%d")
    path.write_text(json.dumps(every, indent=1) + "\n")
    return every


def table(every: dict) -> str:
    """The table of every row of SUPPORT that has a result, in SUPPORT's order."""
    from benchmarks import common

    rows = []
    for row in support.SUPPORT:
        r = every.get(row.name)
        if r is None:
            continue
        framework = f"{row.framework} {row.version}" + (f" ({row.note})" if row.note else "")
        keras = ", ".join(row.keras) or "-"
        if "failed" in r:
            rows.append(common.row([row.python, framework, keras, "", f"failed: {r['failed']}", "", r["date"]]))
            continue
        jobs = "; ".join(f"{k or row.framework}: accuracy {j['accuracy']:.3f}, replicas identical, {j['seconds']:.0f} s"
                         for k, j in r["jobs"].items())
        build = f"{r['build_s']:.0f} s" + (" (cached wheel)" if r["cached"] else " (compiled)")
        rows.append(common.row([row.python, framework, keras, f"{r['install_s']:.0f} s", build, f"ready; {jobs}",
                                r["date"]]))
    header = ["Python", "framework", "Keras", "venv + pip install", "toolkit build-horovod",
              "doctor; horovodrun -np 2 --gloo", "checked"]
    return (f"`.venv/bin/python -m benchmarks.support_matrix --write-docs` (`make support`), {common.machine()}; "
            f"each row's own date in its last column:\n\n" + common.table(header, rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated row names (default: every row), e.g. "
                   + support.SUPPORT[0].name)
    p.add_argument("--write-docs", action="store_true",
                   help=f"write the table of every row's last result into docs/{DOC}")
    p.add_argument("--keep", default=None, metavar="DIR", help="make the virtualenvs in DIR and keep them")
    args = p.parse_args(argv)
    names = {r.name for r in support.SUPPORT}
    chosen = [r for r in support.SUPPORT if args.only is None or r.name in args.only.split(",")]
    unknown = set((args.only or "").split(",")) - names - {""}
    if unknown:
        raise SystemExit(f"--only: unknown {', '.join(sorted(unknown))}; rows: {', '.join(sorted(names))}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="toolkit-support-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        wheel, _ = build_dist(work / "dist")
        print(f"built {wheel.name}", file=sys.stderr)
        for row in chosen:
            result = check_row(row, wheel, work, say=lambda m: print(m, file=sys.stderr, flush=True))
            failed |= "failed" in result
            if "failed" in result:
                print(result["detail"][-4000:], file=sys.stderr)
            every = record(result)
    text = table(every)
    print(text)
    if args.write_docs:
        from benchmarks import common
        common.write_between(common.DOCS / DOC, "support", text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
