"""Small on-disk datasets the workload tests make for themselves (nothing is downloaded): the real
8x8 digits as PNG files in class folders, CIFAR-10's python batches of random pixels, a text file."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from toolkit.data.ondisk import digits_folder  # noqa: F401  (the tests' image folder)


def cifar_folder(root: Path, per_batch: int = 16) -> Path:
    """CIFAR-10's python format (data_batch_1..5, test_batch) holding `per_batch` random images each."""
    rng = np.random.RandomState(0)
    root.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.randint(0, 256, (per_batch, 3072)).astype(np.uint8),
                 b"labels": rng.randint(0, 10, per_batch).tolist()}
        with open(root / name, "wb") as f:
            pickle.dump(batch, f)
    return root


def text_file(path: Path, repeats: int = 60) -> Path:
    """An English text with structure a small language model learns quickly."""
    line = ("the quick brown fox jumps over the lazy dog. a data-parallel job averages the gradients "
            "of every rank before each step, so every replica ends with the same weights.\n")
    path.write_text(line * repeats)
    return path
