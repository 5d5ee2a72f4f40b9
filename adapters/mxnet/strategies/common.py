"""What an MXNet strategy answers beyond adapters/strategy.py, for the MXNet session
(adapters/mxnet/session.py): the context arrays live on (`ctx`) and what the Trainer's update divides
a step's summed gradients by besides the batch (`step_divisor`: 1, or 1/ranks for op=sum).
"""
from __future__ import annotations

from toolkit.adapters.strategy import Strategy


class MxnetStrategy(Strategy):
    ctx = None              # mx.cpu() or this rank's mx.gpu(i), set by start()
    step_divisor = 1.0
