"""Python's cyclic garbage collector paused while a rank starts.

A rank's start is mostly imports (torch, and the torch._dynamo its first optimizer imports; TensorFlow with
Keras; MXNet; Horovod): millions of new objects, almost none of them garbage, which the collector walks
again each time its thresholds trip, and again at every full collection during training.
`collector_paused()` turns it off for the block; at the end the objects made so far are frozen
(`gc.freeze`: later collections skip them) and it runs again. What was alive then stays alive until the
process ends, as imported modules do anyway: a cycle among those objects that becomes garbage later is not
collected. `toolkit/run/pipeline.py` pauses it around `start` (the framework's and Horovod's imports,
init) and around the model's setup. Measured in docs/BENCHMARKS.md ("Setup and start-up times").
"""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collector_paused():
    """The block without Python's cyclic collector, then what it made frozen; a collector someone else
    turned off stays off and nothing is frozen."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
