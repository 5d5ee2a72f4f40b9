"""Per-epoch metrics from rank 0, one writer for every framework:

- `log_dir`: `metrics.jsonl` (one JSON object a line) and TensorBoard event files (tensorboardX: a
  small writer with no TensorFlow dependency, so torch and MXNet users get TensorBoard too;
  `tensorboard --logdir <log_dir>` shows them);
- `wandb_project`: the same scalars to Weights & Biases, when the user installed `wandb` (never
  required: the toolkit does not install it, and without the key it is not imported);
- `mlflow_tracking_uri`: the same scalars to one MLflow run per job (toolkit/run/mlflowrun.py), and the
  job's summary at the end.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from toolkit.config import Config
from toolkit.errors import ToolkitError
from toolkit.install import pins, support


def check(config: Config) -> None:
    """On every rank before training: a missing optional writer stops all ranks with one line."""
    if config.wandb_project and importlib.util.find_spec("wandb") is None:
        raise ToolkitError(f"wandb_project={config.wandb_project!r} needs Weights & Biases, which is not "
                           "installed; run `.venv/bin/pip install wandb`, or unset wandb_project")
    if config.mlflow_tracking_uri and importlib.util.find_spec("mlflow") is None:
        raise ToolkitError(f"mlflow_tracking_uri={config.mlflow_tracking_uri!r} needs MLflow, which is not installed; "
                           f"{support.install_fix('mlflow==' + pins.TOOLS['mlflow'])}, or unset mlflow_tracking_uri")


def wanted(config: Config) -> bool:
    """Whether rank 0 writes metrics anywhere."""
    return bool(config.log_dir or config.wandb_project or config.mlflow_tracking_uri)


def _summary_writer():
    """tensorboardX's SummaryWriter, imported with torch hidden unless torch is already loaded.

    tensorboardX's writer imports torch when it can, only to accept torch tensors (the toolkit logs
    floats). Importing torch after horovod.mxnet kills the process with a segfault (MXNet 1.9.1,
    torch 2.13, seen as soon as an MXNet job set log_dir), and in a TensorFlow rank it would only
    cost a second and memory."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None         # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter


class MetricsLog:
    def __init__(self, config: Config, mlflow_run_id: str | None = None, rank: int = 0):
        self.writer: Any
        self.folder, self.writer, self.wandb, self.mlflow = None, None, None, None
        if config.mlflow_tracking_uri:      # first: an unreachable server is one line before any file is made
            from toolkit.run.mlflowrun import MlflowRun
            self.mlflow = MlflowRun(config, mlflow_run_id, rank)
        if config.log_dir:
            try:
                SummaryWriter = _summary_writer()
            except ImportError:
                raise ToolkitError("log_dir writes TensorBoard files with tensorboardX, which is not installed; "
                                   f"{support.install_fix('tensorboardX==' + pins.TOOLS['tensorboardX'])}, "
                                   "or drop log_dir") from None
            self.folder = Path(config.log_dir)
            self.writer = SummaryWriter(logdir=str(self.folder))
        if config.wandb_project:
            import wandb

            self.wandb = wandb.init(project=config.wandb_project, config=config.to_dict(), dir=config.log_dir)

    def write(self, step: int, values: dict) -> None:
        scalars = {k: v for k, v in values.items() if isinstance(v, (int, float)) and k != "epoch"}
        if self.folder:
            with open(self.folder / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, **values}) + "\n")
            for name, value in scalars.items():
                self.writer.add_scalar(name, value, global_step=step)
            self.writer.flush()
        if self.wandb:
            self.wandb.log({**scalars, "epoch": values.get("epoch")}, step=step)
        if self.mlflow:
            epoch = values.get("epoch")
            self.mlflow.write(step, {**scalars, **({"epoch": epoch} if isinstance(epoch, (int, float)) else {})})

    def close(self, summary: dict | None = None) -> None:
        """`summary`: the job's (the built-in script's), kept by the trackers that keep one (MLflow)."""
        if self.writer:
            self.writer.close()
        if self.wandb:
            self.wandb.finish()
        if self.mlflow:
            self.mlflow.close(summary)
