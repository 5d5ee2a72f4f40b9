"""`toolkit bench`: the synthetic benchmark over a list of world sizes (toolkit/planner/bench.py)."""
import argparse
import json
import sys
from pathlib import Path


def register(sub) -> None:
    from toolkit import config

    p = sub.add_parser("bench", help="synthetic benchmark: samples/sec per worker, total and scaling efficiency",
                       usage="toolkit bench --np 1,2 [--gloo|--mpi] [--features F] [--warmup W] [--iters I] "
                             "[--steps-per-iter S] [--out DIR] [config flags, e.g. --framework torch "
                             "--hidden-size 2048 --hidden-layers 3 --compression fp16]")
    p.add_argument("-np", "--np", default="1,2", help="world sizes to measure, comma separated (default 1,2)")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--gloo", dest="controller", action="store_const", const="gloo", help="Gloo controller")
    ctl.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help="MPI controller")
    p.add_argument("--features", type=int, default=1024, help="input width of the synthetic batch (default 1024)")
    p.add_argument("--classes", type=int, default=10, help="classes of the synthetic labels (default 10)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (default 10)")
    p.add_argument("--steps-per-iter", type=int, default=10, help="optimizer steps per iteration (default 10)")
    p.add_argument("--out", default="runs/bench", help="folder for bench.json, bench.png (default runs/bench)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per world size (default 600)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra variable for every rank")
    p.add_argument("-H", "--hosts", default=None, help="hosts and slots, e.g. a:1,b:1 (default: this machine)")
    p.add_argument("--network-interface", default=None, help="the interface the ranks talk over (e.g. eth0)")
    p.add_argument("--worker-result", default=None, help=argparse.SUPPRESS)   # set for the launched ranks
    config.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit import config
    from toolkit.planner import bench

    options = bench.Options(features=args.features, classes=args.classes, warmup=args.warmup,
                            iters=args.iters, steps_per_iter=args.steps_per_iter)
    cfg = config.resolve(args)       # the bench's own flags are not config fields and are ignored there
    if args.worker_result:           # one rank of a launched job
        result = bench.measure(cfg, options)
        if result is not None:
            Path(args.worker_result).write_text(json.dumps(result) + "\n")
        return 0
    sizes = bench.parse_np(args.np)
    bench.run(cfg, options, sizes, Path(args.out), args.controller, args.timeout, tuple(args.env),
              hosts=args.hosts, network_interface=args.network_interface)
    sys.stdout.flush()
    return 0
