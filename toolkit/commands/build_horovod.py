"""`toolkit build-horovod`: Horovod (the version toolkit/install/pins.py pins) built against this environment's frameworks,
cached."""
from toolkit.install import pins


def register(sub) -> None:
    p = sub.add_parser("build-horovod", help="build (or install from cache) Horovod for the installed frameworks",
                       description="Builds Horovod from its sdist with the workarounds today's frameworks "
                                   "need, verifies each extension imports, and caches the wheel under "
                                   "~/.cache/toolkit/horovod/<key> (TOOLKIT_CACHE_DIR to move it).")
    p.add_argument("--frameworks", default=None,
                   help="comma-separated subset of torch,tensorflow,mxnet (default: every one installed here)")
    p.add_argument("--gpus", "--gpu", dest="gpu", action="store_true",
                   help="for GPUs: GPU operations through NCCL (HOROVOD_GPU_OPERATIONS=NCCL)")
    p.add_argument("--no-mpi", action="store_true", help="build without the MPI controller")
    p.add_argument("--no-gloo", action="store_true", help="build without the Gloo controller")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra build variable, e.g. HOROVOD_DEBUG=1 (repeatable)")
    p.add_argument("--sdist", default=None, help=f"a local horovod sdist instead of fetching horovod=={pins.HOROVOD}")
    p.add_argument("--force", action="store_true", help="rebuild even when the cache holds this build")
    p.add_argument("--cuda-arch", default=None, metavar="LIST",
                   help="GPU builds: compute capabilities, e.g. 80,90 (default: the GPUs present, else 75-90)")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="also copy the wheel and a manifest of what it was built against to DIR/<key>/, for "
                        "`toolkit setup --wheelhouse DIR` on other nodes")
    p.add_argument("--wheelhouse", default=None, metavar="DIR",
                   help="install the build for this environment from DIR (made by --export); no compiler "
                        "needed; refuses a build made for other versions")
    p.add_argument("--explain", action="store_true",
                   help="print this machine's toolchain and which workarounds a build would apply, then exit")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from toolkit.errors import ToolkitError
    from toolkit.install import horovod as horovod_build
    from toolkit.install import support, toolchain

    if args.frameworks is None:
        found = support.found()
        if not found:
            raise ToolkitError(f"build-horovod: no framework installed in {sys.prefix} (torch, tensorflow, mxnet); "
                               f"install one first (e.g. `{support.pip('torch')}`) or name them with --frameworks")
        print("horovod: frameworks found here: " + ", ".join(f"{fw} {v}" for fw, v in found.items()))
        frameworks = tuple(found)
    else:
        frameworks = tuple(f.strip() for f in args.frameworks.split(",") if f.strip())
    spec = horovod_build.BuildSpec(
        frameworks=frameworks,
        gpu=args.gpu, mpi=not args.no_mpi, gloo=not args.no_gloo, extra_env=tuple(args.env),
        cuda_arch=args.cuda_arch)
    if args.explain:
        print(horovod_build.explain(spec, toolchain.detect()))
        return 0
    if args.wheelhouse and (args.force or args.sdist or args.export):
        raise ToolkitError("--wheelhouse installs a build made elsewhere; drop --force/--sdist/--export with it")
    horovod_build.build_and_install(spec, force=args.force, sdist=args.sdist, export=args.export,
                                    wheel_dir=args.wheelhouse)
    return 0
