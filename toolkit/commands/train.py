"""`toolkit train`: one training job on this rank; the same as `python examples/train.py`."""


def register(sub) -> None:
    from toolkit import config

    p = sub.add_parser("train", help="train on this rank (start it with horovodrun, mpirun or `toolkit launch`)")
    config.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit import config
    from toolkit.run import pipeline

    return pipeline.main(config.resolve(args))
