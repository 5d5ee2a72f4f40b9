"""TensorFlow's profiler for a window of steps (toolkit/run/profile.py): its trace (XPlane) in
PROFILE_DIR/rank{R}/, the folder TensorBoard's profile plugin reads (`tensorboard --logdir PROFILE_DIR/rank{R}`)."""
from __future__ import annotations

from pathlib import Path

import tensorflow as tf


def start(session, folder: Path):
    tf.profiler.experimental.start(str(folder / f"rank{session.rank}"))

    def stop() -> None:
        tf.profiler.experimental.stop()
    return stop
