"""`toolkit setup`: Open MPI, .venv, pinned packages, numpy shim, engines asked for, Horovod; idempotent, cached."""
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("setup", help="create .venv with the pinned frameworks and a built Horovod")
    p.add_argument("--venv", default=None, help="virtualenv folder (default: .venv at the repo root; .venv-X.Y for a Python other than "
                        "the pinned one)")
    p.add_argument("--gpus", "--gpu", dest="gpu", action="store_true",
                   help="for GPUs (docker/Dockerfile's variant): tensorflow instead of tensorflow-cpu, torch from "
                        "the CUDA index pip is given, Horovod with NCCL (build-horovod --gpus)")
    p.add_argument("--wheelhouse", default=None, metavar="DIR",
                   help="Horovod from DIR (`toolkit build-horovod --export DIR` on a machine that builds): "
                        "no compilers needed here; a build for other versions is refused")
    p.add_argument("--engines", default=None, metavar="ENGINE[,ENGINE]",
                   help="also install these cluster engines' pins: ray, spark (and Java 17 with apt-get where java is "
                        "missing or older), or all; "
                        "added to those installed before, never removed (`make test` asks for both)")
    p.add_argument("build_args", nargs="*", metavar="-- BUILD-HOROVOD-ARGS",
                   help="passed to `toolkit build-horovod`, after `--`")
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit.install import envsetup

    engines = envsetup.parse_engines(args.engines)    # an unknown name: one line, before anything runs
    build_args = list(args.build_args)
    if args.wheelhouse:
        build_args += ["--wheelhouse", str(Path(args.wheelhouse).resolve())]
    envsetup.setup(Path(args.venv) if args.venv else envsetup.default_venv(), build_args,
                   gpu=args.gpu, engines=engines)
    return 0
