"""Train with the toolkit: the same script single-process, under horovodrun, mpirun or `toolkit launch`.

    python examples/train.py --framework torch --dataset digits
    horovodrun -np 2 --gloo python examples/train.py --framework torch --config cfg.yaml
    mpirun -np 2 python examples/train.py --framework torch

Ends with one JSON line on rank 0's stdout. Same as `toolkit train`.
"""
import sys

from toolkit.cli import run

if __name__ == "__main__":
    run(["train", *sys.argv[1:]])
