"""Per-epoch metrics from rank 0 into `log_dir`: `metrics.jsonl` (one JSON object a line) and
TensorBoard event files (tensorboardX: a small writer with no TensorFlow dependency, so torch and
MXNet users get TensorBoard too; `tensorboard --logdir <log_dir>` shows them)."""
from __future__ import annotations

import json
from pathlib import Path

from toolkit.errors import ToolkitError


class MetricsLog:
    def __init__(self, log_dir: str):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ToolkitError("log_dir writes TensorBoard files with tensorboardX, which is not installed; "
                               "run `make setup` (or pip install tensorboardX==2.6.5), or drop log_dir") from None
        self.folder = Path(log_dir)
        self.writer = SummaryWriter(logdir=str(self.folder))

    def write(self, step: int, values: dict) -> None:
        with open(self.folder / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")
        for name, value in values.items():
            if isinstance(value, (int, float)) and name != "epoch":
                self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
