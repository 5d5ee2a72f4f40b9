"""`toolkit train`: one training job on this rank; the same as `python examples/train.py`."""
import json
import math
import sys


def register(sub) -> None:
    from toolkit import config

    p = sub.add_parser("train", help="train on this rank (start it with horovodrun, mpirun or `toolkit launch`)",
                       usage=f"toolkit train {config.USAGE}")
    config.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """The whole pipeline on this rank (toolkit/run/pipeline.py, trained by toolkit/run/trainer.py); rank 0
    prints the summary as one JSON line."""
    from toolkit import config
    from toolkit.run import trainer

    summary = trainer.run(config.resolve(args))
    if summary.pop("rank") == 0:
        # one write, so mpirun's --tag-output cannot split the line from its newline
        sys.stdout.write(json.dumps(_finite(summary), allow_nan=False) + "\n")
        sys.stdout.flush()
    return 0


def _finite(value):
    """NaN and infinities are not JSON: null instead, at any depth of the summary."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
