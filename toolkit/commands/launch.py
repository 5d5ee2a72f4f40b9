"""`toolkit launch`: start N ranks with horovodrun, plain mpirun, or as TensorFlow workers, with timeouts."""
import argparse
import os
import sys


def register(sub) -> None:
    p = sub.add_parser("launch", help="start a command on N ranks via horovodrun or mpirun",
                       usage="toolkit launch -np N [-H host:slots,...] [--gloo|--mpi] [--framework F] "
                             "[--backend horovod|native] [--dry-run] -- COMMAND ...")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    p.add_argument("-H", "--hosts", default=None, help="host:slots,... (default localhost:N)")
    p.add_argument("--launcher", default=None, choices=("horovodrun", "mpirun", "tf_config"),
                   help="default horovodrun; tf_config with --backend native")
    p.add_argument("--framework", default=None, help="sets TOOLKIT_FRAMEWORK for the ranks (unless set)")
    p.add_argument("--backend", default=None, choices=("horovod", "native"),
                   help="native: TensorFlow workers with TF_CONFIG (MultiWorkerMirroredStrategy), no Horovod")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--gloo", dest="controller", action="store_const", const="gloo", help="Gloo controller")
    ctl.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help="MPI controller")
    p.add_argument("--network-interface", default=None, help="NIC for rank traffic, e.g. lo or eth0")
    p.add_argument("--start-timeout", type=int, default=60, help="seconds for all ranks to start (default 60)")
    p.add_argument("--timeout", type=float, default=None, help="stop the whole job after this many seconds")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra variable for every rank")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment, run nothing")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit import launch

    from toolkit import registry
    from toolkit.errors import ToolkitError

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    launcher = args.launcher or ("tf_config" if args.backend == "native" else "horovodrun")
    if args.backend == "native" and launcher != "tf_config":
        raise ToolkitError(f"--backend native starts TensorFlow workers itself; drop --launcher {launcher}")
    env = list(args.env)
    for key, value in (("framework", args.framework), ("backend", args.backend)):
        if value is not None and f"TOOLKIT_{key.upper()}" not in os.environ:
            env.append(f"TOOLKIT_{key.upper()}={value}")
    if args.framework is not None and args.backend is not None and \
            args.backend not in registry.spec(args.framework).backends:
        raise ToolkitError(f"--backend {args.backend} is not available for --framework {args.framework}; "
                           f"use one of: {', '.join(registry.spec(args.framework).backends)}")
    spec = launch.LaunchSpec(command=tuple(command), np=args.np, hosts=args.hosts, launcher=launcher,
                             controller=args.controller, start_timeout=args.start_timeout,
                             network_interface=args.network_interface, env=tuple(env))
    if args.dry_run:
        plans = launch.plan_workers(spec) if launcher == "tf_config" else [launch.plan(spec)]
        for argv, env in plans:
            print(launch.format_command(argv, env, os.environ))
        return 0
    code = launch.run(spec, timeout=args.timeout)
    if code != 0:
        print(f"toolkit: launch: the job exited with code {code}", file=sys.stderr)
    return code
