"""`toolkit shards SOURCE OUT --framework F [--shard-size N]`: a dataset written as a framework's shards
with their index (toolkit/data/shardwrite.py), for `dataset: shards:OUT`."""


def register(sub) -> None:
    p = sub.add_parser("shards", help="write a dataset as sharded streams (shards:PATH) for one framework")
    p.add_argument("source", metavar="SOURCE", help="imagefolder:PATH, cifar10:PATH or text:PATH (as the config takes it)")
    p.add_argument("out", metavar="OUT", help="the folder to write (the shards and index.json)")
    p.add_argument("--framework", required=True, choices=("torch", "tensorflow", "mxnet"),
                   help="whose format: torch = WebDataset tar, tensorflow = TFRecord, mxnet = RecordIO")
    p.add_argument("--shard-size", type=int, default=10_000, metavar="N", help="samples per shard (default 10000)")
    p.add_argument("--context", type=int, default=64, metavar="T",
                   help="text:PATH only: tokens per sample (the config's context; default 64)")
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit.data import shardwrite
    if args.framework == "tensorflow":      # TensorFlow's start-up chatter off stderr, as in training
        from toolkit.run import quiet
        quiet.filter_stderr()

    shardwrite.write(args.source, args.out, args.framework, args.shard_size, args.context)
    return 0
