"""Each rank's random generators in checkpoints (what Accelerate's `save_state` keeps): Python's, numpy's
global one and the framework's, captured at `session.save` and restored on resume, so a loop that draws
noise or dropout masks resumes on the numbers the uninterrupted run drew.

A state is JSON (lists and base64 strings): rank 0 writes every rank's into the checkpoint's
`random.json`. Restored where the checkpoint was written by the same number of ranks and the framework
can restore its generator (torch: CPU and CUDA; Keras 3: its seed generators); otherwise every rank
reseeds from (seed, step, rank), the same numbers on every rerun, and rank 0 says so once.
"""
from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

FILE = "random.json"


def capture(framework: dict) -> dict:
    """This rank's Python and numpy generators, with the framework's (`framework`, already JSON)."""
    import numpy as np
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(words), gauss],
            "numpy": [name, encode(np.asarray(keys)), int(pos), int(has_gauss), float(cached)], **framework}


def restore(state: dict) -> None:
    """Python's and numpy's generators set back to `state` (the framework's: the session's hook)."""
    import numpy as np
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, decode(keys, np.uint32), pos, has_gauss, cached))


def reseed_value(seed: int, step: int, rank: int) -> int:
    """A seed for (seed, step, rank): different for every rank and resume point, the same on every rerun."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()[:4], "little")


def encode(array) -> str:
    return base64.b64encode(array.tobytes()).decode()


def decode(text: str, dtype):
    import numpy as np
    return np.frombuffer(base64.b64decode(text), dtype=dtype).copy()


def write(folder: Path, states: list[dict]) -> None:
    (Path(folder) / FILE).write_text(json.dumps({"ranks": len(states), "states": states}))


def read(folder: Path) -> dict | None:
    path = Path(folder) / FILE
    return json.loads(path.read_text()) if path.is_file() else None
