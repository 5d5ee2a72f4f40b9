"""The real 8x8 digits (scikit-learn's, no download) as PNG files in class folders: a small image
folder to try `--dataset imagefolder:PATH` with.

    .venv/bin/python examples/digits_images.py runs/digits-images              # PATH/<digit>/<i>.png
    .venv/bin/python examples/digits_images.py runs/digits-images --layout train_val
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def digits_folder(root: Path, per_class: int | None = None, layout: str = "classes") -> Path:
    """scikit-learn's digits as 8x8 grayscale PNGs: `root/<digit>/<i>.png` ("classes": the reader
    holds a fixed fraction out) or `root/train/<digit>/...` and `root/val/<digit>/...` ("train_val",
    every fifth image of a class in val). `per_class` keeps the first N of each class."""
    from PIL import Image
    from sklearn.datasets import load_digits
    bunch = load_digits()
    counts: dict = {}
    for i, (image, label) in enumerate(zip(bunch.images, bunch.target)):
        counts[label] = counts.get(label, 0) + 1
        if per_class is not None and counts[label] > per_class:
            continue
        split = "" if layout == "classes" else ("val" if counts[label] % 5 == 0 else "train")
        folder = Path(root) / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * 255 / 16).astype(np.uint8), mode="L").save(folder / f"{i}.png")
    return Path(root)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="folder to write (made if missing)")
    p.add_argument("--layout", choices=("classes", "train_val"), default="classes")
    p.add_argument("--per-class", type=int, default=None, help="keep the first N images of each class")
    a = p.parse_args()
    print(digits_folder(Path(a.path), a.per_class, a.layout))
