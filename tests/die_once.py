"""examples/train.py whose rank 1 dies (exit 1) right after the first checkpoint, in torchrun's first attempt
only (TORCHELASTIC_RESTART_COUNT 0): what tests/test_native_torch.py's torchrun restart starts from."""
import os
import runpy
import sys
from pathlib import Path

from toolkit.adapters.base import Session

ROOT = Path(__file__).resolve().parent.parent
save = Session.save


def save_then_die(self, *args, **kwargs):
    out = save(self, *args, **kwargs)
    if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and self.rank == 1:
        os._exit(1)
    return out


Session.save = save_then_die
sys.argv = [str(ROOT / "examples" / "train.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
