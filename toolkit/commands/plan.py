"""`toolkit plan`: predicted scaling per communication method on a cluster (toolkit/planner/plan.py, toolkit/planner/scaling.py)."""
import json
import sys
from pathlib import Path


def register(sub) -> None:
    from toolkit import config
    from toolkit.planner.plan import METHODS

    p = sub.add_parser("plan", help="predict scaling efficiency and samples/s on N GPUs for each communication method",
                       usage="toolkit plan [--bench runs/bench | --step-ms MS] [--gpus 8,64,512] "
                             "[--gpus-per-node 8] [--inter-node 25gbit] [--intra-node 300GB/s] [--latency 5us] "
                             "[--calibration FILE] [--methods none,fp16,...] [config flags, e.g. --config cfg.yaml]")
    p.add_argument("--gpus", default="8,64,512", help="GPU counts to predict, comma separated (default 8,64,512)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs in one node (default 8)")
    p.add_argument("--inter-node", default="25gbit", help="one node's network bandwidth, e.g. 25gbit, 100gbit, "
                   "12.5GB/s (default 25gbit)")
    p.add_argument("--intra-node", default="300GB/s", help="bandwidth between the GPUs of one node (default 300GB/s)")
    p.add_argument("--latency", default="5us", help="inter-node latency per message (default 5us)")
    p.add_argument("--intra-latency", default="2us", help="intra-node latency per message (default 2us)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="link costs measured by benchmarks/scaling_calibrate.py (replace --inter-node, --latency)")
    p.add_argument("--bench", default=None, metavar="PATH",
                   help="a toolkit bench result with a 1-worker row (bench.json or its folder); "
                        "without it the plan runs toolkit bench --np 1")
    p.add_argument("--step-ms", type=float, default=None, help="one worker's step time (e.g. measured on your GPU) instead of the bench's; the bench then runs one step, for the gradients' shapes")
    p.add_argument("--straggle", type=float, default=0.0,
                   help="coefficient of variation of a worker's step time, e.g. 0.05 (default 0)")
    p.add_argument("--backward-fraction", type=float, default=2 / 3,
                   help="share of the step that is the backward pass (default 0.667)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"methods to compare (default all: {','.join(METHODS)}; "
                   f"ddp and ddp_fp16 are PyTorch DDP's, the torch backend native, the others run on Horovod)")
    p.add_argument("--compression-ms", type=float, default=None,
                   help="the toolkit's compression work per step (ms) instead of timing it here with numpy")
    p.add_argument("--out", default="runs/plan", help="folder for plan.json, plan.png (default runs/plan)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for the 1-worker bench (default 900)")
    config.add_arguments(p)
    p.set_defaults(func=run)


def cluster_from(args):
    """The cluster from the flags (or a calibration file): every flag checked before anything runs."""
    from toolkit.errors import ToolkitError
    from toolkit.exchange import wire
    from toolkit.planner import scaling, units

    gpus = units.parse_counts(args.gpus, "--gpus")
    if args.gpus_per_node < 1:
        raise ToolkitError(f"--gpus-per-node {args.gpus_per_node}: must be at least 1")
    if args.gpus_per_node > gpus[-1]:
        raise ToolkitError(f"--gpus-per-node {args.gpus_per_node} is larger than the largest --gpus ({gpus[-1]}); "
                           f"give the GPUs of one node, e.g. --gpus-per-node {min(8, gpus[-1])}")
    inter = wire.Link(units.parse_duration(args.latency, "--latency"),
                      units.parse_bandwidth(args.inter_node, "--inter-node"))
    intra = wire.Link(units.parse_duration(args.intra_latency, "--intra-latency"),
                      units.parse_bandwidth(args.intra_node, "--intra-node"))
    kinds: dict = {}        # a calibration's links between nodes, per collective kind
    words = (f"{args.gpus_per_node} GPUs a node, {units.format_bandwidth(inter.bandwidth)} and "
             f"{units.format_duration(inter.alpha)} between nodes, {units.format_bandwidth(intra.bandwidth)} within")
    if args.calibration:
        try:
            data = json.loads(Path(args.calibration).read_text())
            inter = _link(data["inter"])
            kinds = {kind: _link(link) for kind, link in data.get("kinds", {}).items()}
            if "intra" in data:
                intra = _link(data["intra"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ToolkitError(f"--calibration {args.calibration}: not a calibration file ({e}); make one with "
                               f"benchmarks/scaling_calibrate.py") from None
        words = (f"{args.gpus_per_node} GPUs a node, calibrated ({args.calibration}): "
                 f"{units.format_bandwidth(inter.bandwidth)}, {units.format_duration(inter.alpha)} a message"
                 + "".join(f"; {kind} {units.format_bandwidth(k.bandwidth)}" for kind, k in sorted(kinds.items())))
    if args.step_ms is not None and not args.step_ms > 0:
        raise ToolkitError(f"--step-ms {args.step_ms:g}: must be more than 0 (one worker's step in milliseconds)")
    if not 0 <= args.straggle < 1:
        raise ToolkitError(f"--straggle {args.straggle:g}: must be in [0, 1), e.g. 0.05 for 5% variation")
    if not 0 <= args.backward_fraction <= 1:
        raise ToolkitError(f"--backward-fraction {args.backward_fraction:g}: must be in [0, 1], e.g. 0.67")
    if args.compression_ms is not None and args.compression_ms < 0:
        raise ToolkitError(f"--compression-ms {args.compression_ms:g}: must be 0 or more")
    return scaling.Cluster(args.gpus_per_node, inter, intra, kinds), gpus, words


def run(args) -> int:
    from dataclasses import replace

    from toolkit import config
    from toolkit.planner import bench, plan

    cluster, gpus, words = cluster_from(args)
    names = plan.parse_methods(args.methods)
    cfg = config.resolve(args)          # the plan's own flags are not config fields and are ignored there
    out = Path(args.out)
    if args.bench:
        worker = plan.from_bench(Path(args.bench))
    else:        # one worker's step, measured now (with --step-ms given, one step: only its gradients' shapes count)
        rounds = bench.Options(warmup=1, iters=1, steps_per_iter=1) if args.step_ms else \
            bench.Options(warmup=5, iters=5, steps_per_iter=5)
        bench.run(cfg, rounds, [1], out / "bench", None, args.timeout)
        worker = plan.from_bench(out / "bench")
    if args.step_ms is not None:
        worker = replace(worker, step_s=args.step_ms / 1000)
    plan.run(cfg, worker, cluster, gpus, names, out, straggle=args.straggle,
             backward_fraction=args.backward_fraction,
             compression_s=None if args.compression_ms is None else args.compression_ms / 1000, cluster_words=words)
    sys.stdout.flush()
    return 0


def _link(values: dict):
    from toolkit.exchange import wire
    return wire.Link(float(values["alpha"]), float(values["bandwidth"]), float(values.get("overhead", 0.0)))
