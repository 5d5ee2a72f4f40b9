"""What a batch is to the toolkit: numpy arrays or tensors as leaves of tuples, lists and dicts (any
arity, nested ones too). How many samples it holds, and `fn` on each of its leaves; framework-free."""
from __future__ import annotations


def arrays_length(data) -> int | None:
    """Samples in numpy data given as columns: a tuple or list of arrays of any arity (`(x, y)` the
    usual) or a dict of them, all of one length; None for anything else (a framework's dataset)."""
    import numpy as np
    columns = list(data.values()) if isinstance(data, dict) else data
    if not isinstance(columns, (tuple, list)) or not columns:
        return None
    if not all(isinstance(a, np.ndarray) and a.ndim for a in columns):
        return None
    n = len(columns[0])
    return n if all(len(a) == n for a in columns) else None


def map_structure(fn, batch):
    """`fn` on every leaf of a batch (tuples, lists and dicts kept, nested ones too)."""
    if isinstance(batch, dict):
        return {k: map_structure(fn, v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_structure(fn, v) for v in batch)
    return fn(batch)


def leading_size(batch) -> int:
    """Samples in a batch: the first leaf's leading dimension."""
    while isinstance(batch, (dict, tuple, list)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return int(batch.shape[0])
