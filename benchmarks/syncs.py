"""torch: the calls that make the host wait for the device, or read a tensor's values into Python,
counted (a TorchFunctionMode sees every tensor method). tests/user_loop.py counts them per step in
real jobs; benchmarks/gpu_check.py beside CUDA's own sync-debug mode."""
from __future__ import annotations


class SyncCounter:
    """`with counter:` around a step's work; `end_step()` after each optimizer step; `steps` is one
    {call name: count} per step."""
    NAMES = {"item", "__float__", "__int__", "__bool__", "__index__", "tolist", "cpu", "numpy", "__array__"}

    def __init__(self):
        from torch.overrides import TorchFunctionMode
        counter = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in SyncCounter.NAMES:
                    counter.calls[name] = counter.calls.get(name, 0) + 1
                return func(*args, **(kwargs or {}))
        self.mode, self.calls, self.steps = Mode(), {}, []

    def __enter__(self):
        self.mode.__enter__()

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def end_step(self):
        self.steps.append(self.calls)
        self.calls = {}
