"""Learning rate: scaling by world size and linear warm-up, per optimizer step."""
from __future__ import annotations

import math

from toolkit.config import Config, LrScaling


def scaled_lr(config: Config, world_size: int) -> float:
    factor = {LrScaling.NONE: 1.0, LrScaling.LINEAR: float(world_size),
              LrScaling.SQRT: math.sqrt(world_size)}[config.lr_scaling]
    return config.lr * factor


def lr_at(config: Config, world_size: int, step: int, steps_per_epoch: int) -> float:
    """lr for optimizer step `step` (0-based).

    Warm-up ramps linearly over `warmup_epochs`: from the unscaled lr to the scaled one when
    lr_scaling raises it (Goyal et al., as Horovod's LearningRateWarmupCallback), else from
    lr / warmup_steps up to lr.
    """
    target = scaled_lr(config, world_size)
    warmup_steps = int(round(config.warmup_epochs * steps_per_epoch))
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    start = config.lr if target > config.lr else target / warmup_steps
    return start + (target - start) * step / warmup_steps
