"""The real 8x8 digits (scikit-learn's, no download) as PNG files in class folders: a small image
folder to try `--dataset imagefolder:PATH` with.

    .venv/bin/python examples/digits_images.py runs/digits-images              # PATH/<digit>/<i>.png
    .venv/bin/python examples/digits_images.py runs/digits-images --layout train_val
"""
from __future__ import annotations

import argparse
from pathlib import Path

from toolkit.data.ondisk import digits_folder

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="folder to write (made if missing)")
    p.add_argument("--layout", choices=("classes", "train_val"), default="classes")
    p.add_argument("--per-class", type=int, default=None, help="keep the first N images of each class")
    a = p.parse_args()
    print(digits_folder(Path(a.path), a.per_class, a.layout))
