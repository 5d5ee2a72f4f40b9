"""Learning rate per optimizer step: scaling by world size, linear warm-up, then the lr_schedule (constant,
cosine, step). Every framework takes its lr from `lr_at` (session.lr, the trainer, the parameter server)."""
from __future__ import annotations

import math

from toolkit.config import Config, LrScaling, LrSchedule


def scaled_lr(config: Config, world_size: int) -> float:
    factor = {LrScaling.NONE: 1.0, LrScaling.LINEAR: float(world_size),
              LrScaling.SQRT: math.sqrt(world_size)}[config.lr_scaling]
    return config.lr * factor


def lr_at(config: Config, world_size: int, step: int, steps_per_epoch: int) -> float:
    """lr for optimizer step `step` (0-based).

    Warm-up ramps linearly over `warmup_epochs`: from the unscaled lr to the scaled one when
    lr_scaling raises it (Goyal et al., as Horovod's LearningRateWarmupCallback), else from
    lr / warmup_steps up to lr. After it, `after_warmup`: the schedule from the scaled lr.
    """
    target = scaled_lr(config, world_size)
    warmup_steps = int(round(config.warmup_epochs * steps_per_epoch))
    if warmup_steps <= 0 or step >= warmup_steps:
        return after_warmup(config, target, step, max(warmup_steps, 0), steps_per_epoch)
    start = config.lr if target > config.lr else target / warmup_steps
    return start + (target - start) * step / warmup_steps


def after_warmup(config: Config, target: float, step: int, warmup_steps: int, steps_per_epoch: int) -> float:
    """The lr_schedule at `step` (past the warm-up's `warmup_steps`), from the scaled lr `target`.

    constant: `target`, untouched (the lr of before lr_schedule existed, bit for bit).
    cosine: target x (1 + cos(pi x t / T)) / 2 with t = step - warmup_steps and T the steps of the run left after the
        warm-up (epochs x steps_per_epoch - warmup_steps): target right after the warm-up, 0 once the last step is
        done (and after it: a resumed or a parameter server's extra step never goes negative).
    step: target x lr_step_gamma ** (the decays so far), one decay every lr_step_epochs (rounded to whole steps)
        counted from the first step, warm-up included, as torch's StepLR counts epochs (Goyal et al.'s
        decays at epochs 30, 60, 80 with a 5-epoch warm-up).
    """
    if config.lr_schedule is LrSchedule.CONSTANT:
        return target
    if config.lr_schedule is LrSchedule.COSINE:
        left = config.epochs * steps_per_epoch - warmup_steps
        progress = min(1.0, max(0.0, (step - warmup_steps) / left)) if left > 0 else 1.0
        return target * (1 + math.cos(math.pi * progress)) / 2
    # lr_schedule step: lr_step_epochs and lr_step_gamma are set (toolkit/config/derived.py)
    every = max(1, int(round(config.lr_step_epochs * steps_per_epoch)))    # type: ignore[operator]
    return target * config.lr_step_gamma ** (step // every)                 # type: ignore[operator]
