"""`toolkit launch`: start N ranks with horovodrun (or plain mpirun), with timeouts."""
import argparse
import os
import sys


def register(sub) -> None:
    p = sub.add_parser("launch", help="start a command on N ranks via horovodrun or mpirun",
                       usage="toolkit launch -np N [-H host:slots,...] [--gloo|--mpi] [--dry-run] -- COMMAND ...")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    p.add_argument("-H", "--hosts", default=None, help="host:slots,... (default localhost:N)")
    p.add_argument("--launcher", default="horovodrun", choices=("horovodrun", "mpirun"))
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

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    spec = launch.LaunchSpec(command=tuple(command), np=args.np, hosts=args.hosts, launcher=args.launcher,
                             controller=args.controller, start_timeout=args.start_timeout,
                             network_interface=args.network_interface, env=tuple(args.env))
    if args.dry_run:
        argv, env = launch.plan(spec)
        print(launch.format_command(argv, env, os.environ))
        return 0
    code = launch.run(spec, timeout=args.timeout)
    if code != 0:
        print(f"toolkit: launch: the job exited with code {code}", file=sys.stderr)
    return code
