"""The GPU choices of the torch engines, checked on a machine without a GPU: torch's CUDA runtime and
torch.distributed's process-group calls are replaced by recorders (a host of 4 GPUs, this process its local rank
1 of 4), the toolkit's own code runs as it is. What a real GPU then does with them is the GPU check's
(benchmarks/gpu_check.py): one GPU per local rank, NCCL for the native engine's gradients with Gloo beside it for
numpy and pickled objects, pinned host memory in the loaders and non-blocking copies to the GPU."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

from toolkit import config as config_module
from toolkit.adapters.torch.session import TorchSession
from toolkit.adapters.torch.strategies import horovod as horovod_strategy
from toolkit.adapters.torch.strategies import native

GPUS, LOCAL_RANK, LOCAL_SIZE = 4, 1, 4


@pytest.fixture
def four_gpus(monkeypatch):
    """torch.cuda says 4 GPUs; set_device is recorded; torch's thread count is put back after."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: GPUS)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    threads = torch.get_num_threads()
    yield chosen
    torch.set_num_threads(threads)


def test_the_native_engine_pins_its_local_ranks_gpu_and_moves_gradients_over_nccl(four_gpus, monkeypatch):
    calls = {}
    for name, value in dict(RANK="5", WORLD_SIZE="8", LOCAL_RANK=str(LOCAL_RANK), LOCAL_WORLD_SIZE=str(LOCAL_SIZE),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT="29511").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(init=(backend, kw)))
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 5)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 8)
    monkeypatch.setattr(dist, "new_group", lambda *a, **kw: calls.setdefault("groups", []).append(kw) or object())
    monkeypatch.setattr(native.atexit, "register", lambda fn: None)
    strategy = native.TorchNative(config_module.load({"framework": "torch", "backend": "native"}))
    where = strategy.start()
    assert four_gpus == [LOCAL_RANK] and strategy.device == torch.device("cuda", LOCAL_RANK)
    backend, options = calls["init"]
    assert backend == "nccl" and strategy.backend == "nccl", calls
    assert options["device_id"] == torch.device("cuda", LOCAL_RANK), options       # NCCL's eager init on this GPU
    assert calls["groups"] == [{"backend": "gloo"}], calls     # numpy arrays and objects cross on the CPU
    assert (where.rank, where.size, where.local_rank, where.local_size) == (5, 8, LOCAL_RANK, LOCAL_SIZE)
    assert where.device == "cuda:1"


def test_the_horovod_engine_pins_its_local_ranks_gpu(four_gpus, monkeypatch):
    hvd = types.SimpleNamespace(rank=lambda: 5, size=lambda: 8, local_rank=lambda: LOCAL_RANK,
                                local_size=lambda: LOCAL_SIZE)
    strategy = horovod_strategy.TorchHorovod(config_module.load({"framework": "torch"}))
    fusion = []
    monkeypatch.setattr(strategy, "init", lambda comm, default_fusion_mb: fusion.append(default_fusion_mb) or hvd)
    where = strategy.start()
    assert four_gpus == [LOCAL_RANK] and where.device == "cuda:1" and strategy.device.index == LOCAL_RANK
    assert fusion == [None]         # on a GPU Horovod keeps its own fusion buffer (the CPU's is the toolkit's)


class _Copies(torch.overrides.TorchFunctionMode):
    """Records Tensor.to's device and non_blocking and returns the tensor where it is (no GPU here)."""

    def __init__(self):
        super().__init__()
        self.seen: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            self.seen.append((args[1] if len(args) > 1 else kwargs.get("device"), kwargs.get("non_blocking")))
            return args[0]
        return func(*args, **kwargs)


def _session_on(device):
    """The attributes the loaders read, of a session whose strategy placed it on `device`."""
    me = types.SimpleNamespace(config=types.SimpleNamespace(loader_workers=0), _streams_read=0,
                               _loader_generator=lambda epoch: None)
    me.torch_device = device
    me.to_device = lambda value: TorchSession.to_device(me, value)
    return me


@pytest.mark.parametrize("device, pinned", [(torch.device("cuda", 1), True), (torch.device("cpu"), False)])
def test_the_loaders_pin_host_memory_and_copy_without_blocking_on_a_gpu(device, pinned, monkeypatch):
    made = []
    real = torch.utils.data.DataLoader

    def loader(*args, **kwargs):
        made.append(kwargs["pin_memory"])
        kwargs["pin_memory"] = False            # no GPU to pin for here
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", loader)
    me = _session_on(device)
    data = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2), torch.arange(4))
    plan = [np.array([0, 1]), np.array([2, 3])]
    with _Copies() as copies:
        batches = list(TorchSession._dataset_batches(me, data, plan, types.SimpleNamespace(epoch=0)))
        stream = list(TorchSession._stream_batches(me, data, 2, False))
    assert made == [pinned, pinned] and len(batches) == 2 and len(stream) == 2
    assert copies.seen == [(device, True)] * 8, copies.seen       # every tensor of every batch, non-blocking
