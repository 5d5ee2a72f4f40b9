"""Environment checks for `toolkit doctor`. Each framework is probed in its own subprocess."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from toolkit import registry
from toolkit.install import horovod as horovod_build
from toolkit.install import pins, support

_PROBE = r"""
import json, sys
fw, ext = sys.argv[1], sys.argv[2]
out = {}
try:
    m = __import__(fw)
    out["version"] = getattr(m, "__version__", "?")
    if fw == "torch":
        out["gpus"] = m.cuda.device_count() if m.cuda.is_available() else 0
        import torch.distributed as dist
        out["native"] = [b for b in ("gloo", "nccl", "mpi") if dist.is_available() and
                         getattr(dist, f"is_{b}_available")()]
    elif fw == "tensorflow":
        out["gpus"] = len(m.config.list_physical_devices("GPU"))
    elif fw == "mxnet":
        out["gpus"] = m.context.num_gpus()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
try:
    import importlib
    hvd = importlib.import_module(ext)
    out["horovod"] = {k: bool(getattr(hvd, k)()) for k in
                      ("mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built")}
except Exception as e:
    out["horovod_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
print(json.dumps(out))
"""


_FAILED: list[str] = []       # the checks that printed FAIL in this report: any makes doctor exit 1


def _line(status: str, what: str, detail: str, fix: str = "") -> None:
    if status == "FAIL":
        _FAILED.append(what.strip())
    print(f"{status:5} {what:22} {detail}" + (f"\n      fix: {fix}" if fix else ""))


_MPI_PROBE = r"""
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
if comm.Get_rank() == 0:
    print(total, MPI.Get_library_version().splitlines()[0].split(",")[0].strip())
"""


def _check_mpi(mpirun: str, mpirun_version: str) -> None:
    """A real 2-process MPI job through mpi4py (what sync: ssp/async_ps and `hvd.init(comm=...)`
    use), and the library mpi4py loaded against the mpirun on PATH."""
    import os
    argv = [mpirun, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe", "-np", "2",
            sys.executable, "-c", _MPI_PROBE]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        _line("FAIL", "mpi job", "a 2-process mpi4py allreduce did not finish in 60 s",
              "check `mpirun -np 2 hostname`; on containers try OMPI_MCA_btl_vader_single_copy_mechanism=none")
        return
    out = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not out or not out[-1].startswith("3 "):
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        _line("FAIL", "mpi job", f"2-process mpi4py allreduce failed (exit {proc.returncode}): {why}",
              "reinstall mpi4py against this Open MPI (`pip install --force-reinstall mpi4py`)")
        return
    library = out[-1].split(" ", 1)[1]
    number = library.split("v")[-1]
    same = number in mpirun_version
    _line("ok" if same else "warn", "mpi job", f"2-process mpi4py allreduce ok; mpi4py runs on {library}",
          "" if same else f"mpi4py loads {library} but mpirun is `{mpirun_version}`: put one MPI first on PATH and "
                          "LD_LIBRARY_PATH")


ALL = "all"


def _check_toolchain() -> None:
    """What a build here would use (toolkit/install/toolchain.py), and what the installed build was made with."""
    from toolkit.install import toolchain

    found = toolchain.detect()
    built = horovod_build.installed_build() or {}
    _line("info", "toolchain", found.describe() + (f"; the installed Horovod: {built['toolchain']}, workarounds "
                                                   f"{', '.join(built.get('workarounds', [])) or 'none'}"
                                                   if built.get("toolchain") not in (None, "not recorded") else ""))
    if found.nccl:
        other = f"; not {found.other_nccl.describe()} (one NCCL per process: torch loads the wheel's)" \
            if found.other_nccl else ""
        _line("info", "nccl", f"a GPU build (`build-horovod --gpus`) links {found.nccl.describe()}{other}")
    else:
        _line("info", "nccl", "none found: a GPU build needs the nvidia-nccl-cu* wheel (torch's CUDA wheels bring "
                              "it) or libnccl-dev")
    if built.get("nccl"):
        _line("info", "  horovod's nccl", f"the installed build linked NCCL {built['nccl']['version']} from "
                                          f"{built['nccl']['source']}")
    _line("info", "nvcc", found.nvcc or "none (only GPU builds need it: CUDA's toolkit, or the nvidia-cuda-nvcc wheel)")


def _setup_frameworks() -> list[str] | None:
    """The frameworks `toolkit setup` installed in this virtualenv (its stamp's second line), if known."""
    try:
        lines = (Path(sys.prefix) / ".toolkit-pins").read_text().split()
    except OSError:
        return None
    return lines[1].split(",") if len(lines) > 1 else None


def _check_versions(fw: str, chosen: list[str] | None) -> None:
    """The installed versions of `fw`'s distributions: against the pins in `make setup`'s virtualenv (its
    stamp names the frameworks it installed), else against the support table (toolkit/install/support.py)."""
    if chosen is not None:          # `make setup`'s virtualenv: the pins are the promise
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        for name in pins.FRAMEWORK_DISTRIBUTIONS[fw]:
            want = {**pins.FRAMEWORKS, **pins.NO_DEPS}[name]
            have = support.version(name)
            ok = have is not None and have.split("+")[0] == want
            if not ok and not pins.wanted(name, chosen):
                _line("info", name, f"{have or 'not installed'}: setup left it out on Python {py} (no wheels; "
                                    f"this virtualenv has {', '.join(chosen)})")
                continue
            _line("ok" if ok else "warn", name, have or "not installed",
                  "" if ok else f"pinned {name}=={want}: {support.fix(support.pip(f'{name}=={want}'))}")
        return
    have = support.installed(fw)
    if have is None:
        _line("FAIL", fw, "not installed", support.install_fix(*pins.framework_requirements(fw)))
        return
    note = support.outside(fw, have)
    _line("warn" if note else "ok", fw, f"{have}" + (f": {note}; the build is still tried" if note else
                                                      " (in the support table, docs/INSTALL.md)"))
    if fw == "tensorflow":
        keras = ", ".join(f"{d} {v}" for d in ("keras", "tf-keras") if (v := support.version(d)))
        _line("info", "  keras", keras or "none installed",
              "" if keras else support.install_fix("keras"))


def _engine_fix(engine: str, setups_venv: bool) -> str:
    """In `toolkit setup`'s virtualenv: setup with the engine (setup adds it, Java too); elsewhere pip of its pins."""
    if setups_venv and support.source_tree():
        return f"`toolkit setup --engines {engine}`" + (f" (or `make setup ENGINES={engine}`)"
                                                         if support.in_checkout() else "")
    return f"`{support.pip(*pins.engine_requirements([engine]))}`"


def _check_engines(setups_venv: bool) -> None:
    """The optional cluster engines (pins.ENGINES), each on its line, and the Java Spark runs on: informational,
    never a failure (who wants neither needs neither). Versions from the metadata: nothing imported."""
    from toolkit.install import envsetup

    for engine, pinned in pins.ENGINES.items():
        for name in (n.split("[")[0] for n in pinned):
            have = support.version(name)
            _line("ok" if have else "info", name,
                  have or f"not installed (optional: only runs on {engine.capitalize()} need it)",
                  "" if have else _engine_fix(engine, setups_venv))
    need = max(pins.ENGINE_JAVA.values())
    java, major = envsetup.java_path(), envsetup.java_version()
    spark = support.version("pyspark") is not None
    fix = f"apt-get install {' '.join(pins.ENGINE_APT['spark'])} (as root)"
    if major is not None and major >= need:
        _line("ok", "java", f"{major} ({java}); Spark needs {need} or newer")
    elif major is not None:
        _line("warn" if spark else "info", "java", f"{major} ({java}): Spark needs {need} or newer", fix)
    else:
        _line("warn" if spark else "info", "java", f"none found: Spark needs Java {need} or newer", fix)


def _check_runtime(wanted: list[str]) -> None:
    """What Horovod imports at run time (its setup.py's install_requires; cffi for torch)."""
    names = [n for n in support.HOROVOD_RUNTIME if n != "cffi" or "torch" in wanted]
    absent = support.missing(names)
    _line("FAIL" if absent else "ok", "horovod's runtime",
          f"missing {', '.join(absent)}" if absent else ", ".join(f"{n} {support.version(n)}" for n in names),
          f"{support.pip(*support.pinned(*absent))} (`toolkit build-horovod` installs them too)" if absent else "")


def report(framework: str) -> int:
    """Print the checks of `framework` (`all`: every one) and which of them can train; return 1 if one it
    asked for cannot train here or any check printed FAIL, else 0. Nothing about a framework that was not
    asked for."""
    if framework != ALL:
        registry.spec(framework)   # an unknown name fails now, not after the probes
    _FAILED.clear()
    wanted = list(pins.HOROVOD_FRAMEWORKS) if framework == ALL else [framework]
    chosen = _setup_frameworks()
    note = support.python_outside() if chosen is None else ""
    _line("warn" if note else "ok", "python", f"{sys.version.split()[0]} ({sys.executable})", note)
    for fw in wanted:
        _check_versions(fw, chosen)
    _check_runtime(wanted)

    mpirun = shutil.which("mpirun")
    if mpirun:
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout.splitlines()
        _line("ok", "mpi", version[0] if version else mpirun)
    else:
        _line("warn", "mpi", "mpirun not found: `horovodrun --gloo` runs without it; mpirun, Horovod's MPI "
                             "controller and the parameter server need Open MPI",
              f"apt-get install {' '.join(pins.APT_PACKAGES)}")
    m4 = support.version("mpi4py")
    _line("ok" if m4 else "info", "mpi4py", m4 or "not installed (only sync: ssp/async_ps needs it)",
          "" if m4 else support.install_fix("mpi4py"))
    if mpirun and m4:
        _check_mpi(mpirun, version[0] if version else "")

    hvd = support.version("horovod")
    key = horovod_build.installed_key()
    _line("ok" if hvd else "FAIL", "horovod", f"{hvd or 'not installed'}" + (f" (build {key})" if key else ""),
          "" if hvd else support.fix(f"toolkit build-horovod --frameworks {','.join(wanted)}"))

    _check_toolchain()
    _check_engines(chosen is not None)

    usable: dict[str, bool | str] = {}
    for fw in wanted:
        _, module, ext = pins.HOROVOD_FRAMEWORKS[fw]
        proc = subprocess.run([sys.executable, "-c", _PROBE, module, ext], capture_output=True, text=True,
                              timeout=300)
        try:
            probe = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            probe = {"error": (proc.stderr.strip().splitlines() or ["probe crashed"])[-1]}
        if "error" in probe:
            _line("FAIL", f"{fw}", probe["error"], support.install_fix(*pins.framework_requirements(fw)))
            usable[fw] = False
            continue
        _line("ok", fw, f"{probe['version']}, {probe['gpus']} GPU(s)")
        native = probe.get("native")
        if native is not None:     # torch's own engine (backend native): torch.distributed, no Horovod
            _line("ok" if "gloo" in native else "warn", "  torch.distributed",
                  f"backend native (DDP, FSDP2, ZeRO) over: {', '.join(native) or 'nothing'}",
                  "" if "gloo" in native else "a torch build with distributed support")
        if "horovod_error" in probe:
            fix = f"`toolkit build-horovod --frameworks {fw}` (do not trust `horovodrun --check-build`)"
            if native and "gloo" in native:     # the native engine trains without Horovod
                _line("warn", f"  {ext}", f"{probe['horovod_error']}; backend native trains without it", fix)
                usable[fw] = "backend native only"
                continue
            _line("FAIL", f"  {ext}", probe["horovod_error"], fix)
            usable[fw] = False
            continue
        built = probe["horovod"]
        ops = ", ".join(k[:-6] for k, v in built.items() if v) or "none"
        _line("ok", f"  {ext}", f"imports; built with: {ops}")
        if probe["gpus"] and not built["nccl_built"]:
            _line("warn", "  gpu ops", "GPUs present but Horovod has no NCCL",
                  "`toolkit build-horovod --gpus` on this machine")
        usable[fw] = True

    nvsmi = shutil.which("nvidia-smi")
    if nvsmi:
        gpus = subprocess.run([nvsmi, "-L"], capture_output=True, text=True).stdout.strip()
        _line("ok", "gpus", gpus.replace("\n", "; ") or "nvidia-smi lists none")
    else:
        _line("info", "gpus", "no nvidia-smi: CPU only (every adapter falls back to CPU)")

    ready = [fw for fw in wanted if usable.get(fw) and registry.is_available(fw)]
    missing = [fw for fw in wanted if fw not in ready]
    ready = [fw + (f" ({usable[fw]})" if isinstance(usable[fw], str) else "") for fw in ready]
    failed = [what for what in _FAILED if what not in missing]
    print(f"\nready: {', '.join(ready) or 'no framework'}" +
          (f"; NOT READY: {', '.join(missing)} cannot train here; apply the fixes above" if missing else "") +
          (f"; FAILED: {', '.join(failed)} (the fixes above)" if failed else ""))
    return 1 if missing or failed else 0
