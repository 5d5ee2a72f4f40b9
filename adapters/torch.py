"""PyTorch through Horovod: `hvd.DistributedOptimizer` with compression, accumulation and op.

With the toolkit's exchange (compression bf16/int8/topk, local SGD) the optimizer stays local and
toolkit/communication.py moves the gradients through `local_gradients` / `apply_gradients`.
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from adapters.base import (CPU_FUSION_THRESHOLD_MB, Adapter, Topology, require_gpu_if_asked, start_horovod,
                           threads_per_rank)
from toolkit.config import Compression, Config, Model, Op, Optimizer

STATE_FILE = "state.pt"


def build_model(config: Config, num_features: int, num_classes: int) -> torch.nn.Module:
    if config.model is Model.LINEAR:
        return torch.nn.Linear(num_features, num_classes)
    layers, width = [], num_features
    for _ in range(config.hidden_layers):
        layers += [torch.nn.Linear(width, config.hidden_size), torch.nn.ReLU()]
        width = config.hidden_size
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, num_classes))


class TorchAdapter(Adapter):
    name = "torch"
    path = "horovod.torch DistributedOptimizer"

    def init(self, config: Config, comm=None) -> Topology:
        has_gpu = torch.cuda.is_available()
        # measured on torch only (docs/BENCHMARKS.md); GPUs keep Horovod's default for NCCL
        self.hvd = hvd = start_horovod(config, "horovod.torch", "torch",
                                       default_fusion_mb=None if has_gpu else CPU_FUSION_THRESHOLD_MB, comm=comm)
        torch.set_num_threads(threads_per_rank())
        require_gpu_if_asked(has_gpu)
        if has_gpu:
            torch.cuda.set_device(hvd.local_rank())
            self.device = torch.device("cuda", hvd.local_rank())
        else:
            self.device = torch.device("cpu")
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), str(self.device))

    def build(self, config: Config, num_features: int, num_classes: int) -> None:
        torch.manual_seed(config.seed + self.hvd.rank())
        self.model = build_model(config, num_features, num_classes).to(self.device)
        params = self.model.parameters()
        if config.optimizer is Optimizer.SGD:
            self.optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                                             weight_decay=config.weight_decay)
        else:
            self.optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)

    def wrap(self, config: Config) -> None:
        if config.toolkit_exchange:
            return
        hvd = self.hvd
        self.optimizer = hvd.DistributedOptimizer(
            self.optimizer, named_parameters=self.model.named_parameters(),
            compression=hvd.Compression.fp16 if config.compression is Compression.FP16 else hvd.Compression.none,
            backward_passes_per_step=config.accumulation_steps,
            op={Op.AVERAGE: hvd.Average, Op.SUM: hvd.Sum, Op.ADASUM: hvd.Adasum}[config.op])

    def broadcast(self, root: int = 0) -> None:
        # Optimizer state first: Horovod fills an empty state with a zero-gradient step, which
        # must not touch parameters after they are made equal.
        self.hvd.broadcast_optimizer_state(self.optimizer, root_rank=root)
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=root)

    def join(self) -> int:
        return self.hvd.join()

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _tensors(self, x, y):
        return (torch.from_numpy(x).to(self.device, non_blocking=True),
                torch.from_numpy(y).to(self.device, non_blocking=True))

    def _backward(self, batches) -> float:
        """Gradients of the mean loss over the micro-batches, in .grad."""
        if not self.model.training:      # evaluate() left it in eval mode (train() walks every module)
            self.model.train()
        self.optimizer.zero_grad()
        total = None
        for x, y in batches:
            xt, yt = self._tensors(x, y)
            loss = F.cross_entropy(self.model(xt), yt)
            if len(batches) > 1:
                loss = loss / len(batches)
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        return float(total)

    def train_step(self, batches) -> float:
        loss = self._backward(batches)
        self.optimizer.step()
        return loss

    def local_gradients(self, batches):
        loss = self._backward(batches)
        return loss, [p.grad.detach().cpu().numpy() for p in self.model.parameters()]

    def apply_gradients(self, grads) -> None:
        for p, g in zip(self.model.parameters(), grads):
            p.grad.copy_(torch.from_numpy(g))
        self.optimizer.step()

    def weights(self) -> list:
        return [p.detach().cpu().numpy() for p in self.model.parameters()]

    @torch.no_grad()
    def set_weights(self, arrays) -> None:
        for p, a in zip(self.model.parameters(), arrays, strict=True):
            p.copy_(torch.from_numpy(a))

    def _state_tensors(self) -> list:
        slots = [self.optimizer.state[p] for p in self.model.parameters()]
        return list(self.model.parameters()) + [s[k] for s in slots for k in sorted(s) if torch.is_tensor(s[k])]

    def get_state(self) -> list:
        return [t.detach().cpu().numpy() for t in self._state_tensors()]

    @torch.no_grad()
    def set_state(self, arrays) -> None:
        for t, a in zip(self._state_tensors(), arrays, strict=True):
            t.copy_(torch.from_numpy(a))

    @torch.no_grad()
    def evaluate(self, x, y) -> tuple[float, int, int]:
        self.model.eval()
        if len(x) == 0:
            return 0.0, 0, 0
        xt, yt = self._tensors(x, y)
        logits = self.model(xt)
        loss = F.cross_entropy(logits, yt, reduction="sum")
        return float(loss), int((logits.argmax(1) == yt).sum()), len(y)

    def save(self, folder: Path) -> None:
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                   folder / STATE_FILE)

    def load(self, folder: Path) -> None:
        state = torch.load(folder / STATE_FILE, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def snapshot(self):
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})

    def restore(self, snapshot) -> None:
        self.model.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])

    def parameters(self) -> list:
        return [v.detach().cpu().numpy() for v in self.model.state_dict().values()]

    def allreduce(self, array, average: bool = True, name: str | None = None):
        out = self.hvd.allreduce(torch.from_numpy(np.ascontiguousarray(array)),
                                 op=self.hvd.Average if average else self.hvd.Sum, name=name)
        return out.numpy()

    def allgather(self, array):
        return self.hvd.allgather(torch.from_numpy(np.ascontiguousarray(array))).numpy()
