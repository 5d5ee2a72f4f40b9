"""PyTorch through Horovod: `hvd.DistributedOptimizer` with compression, accumulation and op.

The session moves the user's module to this rank's device (one GPU per local rank, else the CPU),
broadcasts its parameters, buffers and the optimizer's state from rank 0, and wraps the optimizer
in Horovod's DistributedOptimizer (`backward_passes_per_step` = accumulation_steps). With the
toolkit's exchange (compression bf16/int8/topk/powersgd, local SGD) the optimizer stays local and
toolkit/communication.py moves the gradients through `local_gradients` / `apply_gradients`.
Loaders: numpy `(x, y)` arrays are indexed directly; a `torch.utils.data.Dataset` is read by
torch's own DataLoader (workers, pinned memory on a GPU) with the toolkit's sampler as its batch
sampler.
"""
from __future__ import annotations

import contextlib
import copy
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from toolkit.adapters.base import Session, Topology
from toolkit.adapters.horovod import (CPU_FUSION_THRESHOLD_MB, gpu_for_local_rank, reduction, require_gpu_if_asked,
                                      start_horovod, threads_per_rank)
from toolkit.config import Op, Optimizer
from toolkit.errors import ToolkitError

STATE_FILE = "state.pt"


class TorchSession(Session):
    name = "torch"
    path = "horovod.torch DistributedOptimizer"
    _array_ops = None

    def _start(self, comm=None) -> Topology:
        config = self.config
        has_gpu = torch.cuda.is_available()
        # measured on torch only (docs/BENCHMARKS.md); GPUs keep Horovod's default for NCCL
        self.hvd = hvd = start_horovod(config, "horovod.torch", "torch",
                                       default_fusion_mb=None if has_gpu else CPU_FUSION_THRESHOLD_MB, comm=comm)
        torch.set_num_threads(threads_per_rank())
        require_gpu_if_asked(has_gpu)
        gpu = gpu_for_local_rank(torch.cuda.device_count() if has_gpu else 0, hvd.local_rank(), hvd.local_size(),
                                 config.allow_cpu)
        if gpu is not None:
            torch.cuda.set_device(gpu)
            self.torch_device = torch.device("cuda", gpu)
        else:
            self.torch_device = torch.device("cpu")
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), str(self.torch_device))

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    # -- the user's objects -------------------------------------------------------------------------
    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        from toolkit.adapters.torch import models
        return models.build(self.config, num_features, num_classes, input_shape)

    def _place(self, model):
        if not isinstance(model, torch.nn.Module):
            raise ToolkitError(f"session.setup(model): expected a torch.nn.Module, got {type(model).__name__}")
        if self.config.sync_batchnorm:      # batch statistics over every rank (adapters/torch/batchnorm.py)
            from toolkit.adapters.torch import batchnorm
            model = batchnorm.convert(model, self.hvd)
        return model.to(self.torch_device)

    def _make_optimizer(self, model):
        c = self.config
        if c.optimizer is Optimizer.SGD:
            return torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.optimizer_momentum, weight_decay=c.weight_decay)
        return torch.optim.Adam(model.parameters(), lr=c.lr, weight_decay=c.weight_decay)

    def _cross_entropy(self, logits, labels):
        if logits.dim() == 3:       # a language model's [batch, T, vocab] against [batch, T]
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return F.cross_entropy(logits, labels)

    def _wrap(self) -> None:
        precision = self.config.precision.value
        self._autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(self.torch_device.type) if precision == "fp16" else None
        if self.config.toolkit_exchange:
            return
        compression, op = reduction(self.hvd, self.config)
        self.optimizer = self.hvd.DistributedOptimizer(
            self.optimizer, named_parameters=self.model.named_parameters(), compression=compression,
            backward_passes_per_step=self.config.accumulation_steps, op=op)

    def broadcast(self, root: int = 0) -> None:
        # Optimizer state first: Horovod fills an empty state with a zero-gradient step, which
        # must not touch parameters after they are made equal.
        self.hvd.broadcast_optimizer_state(self.optimizer, root_rank=root)
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=root)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _train_mode(self, training: bool) -> None:
        self.model.train(training)

    # -- data ---------------------------------------------------------------------------------------
    dataset_kind = "a torch.utils.data.Dataset with a length"

    def _dataset_length(self, data):
        return len(data) if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__") else None

    def _tensor(self, array):
        return self._to_device(torch.from_numpy(array))

    def _dataset_batches(self, data, plan, sampler):
        gpu = self.torch_device.type == "cuda"
        reader = torch.utils.data.DataLoader(data, batch_sampler=[idx.tolist() for idx in plan],
                                             num_workers=self.config.loader_workers, pin_memory=gpu)
        for batch in reader:
            x, y = batch
            yield self._to_device(x), self._to_device(y)

    def _to_device(self, tensor):
        return tensor.to(self.torch_device, non_blocking=True)

    # -- the step -----------------------------------------------------------------------------------
    def autocast(self):
        """The forward pass in the config's precision (torch.autocast; fp32: nothing)."""
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.torch_device.type, dtype=self._autocast_dtype)

    def backward(self, loss, tape=None) -> None:
        k = self.config.accumulation_steps
        loss = loss / k if k > 1 else loss
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        self._loss = loss.detach() if self.micro == 0 else self._loss + loss.detach()    # the step's mean loss
        self.micro += 1

    def _micro_batches(self, batches):
        """Mean loss of the micro-batches (a device tensor, no host sync) with their gradients in .grad."""
        if not self.model.training:
            self.model.train()
        self.optimizer.zero_grad()
        total = None
        for x, y in batches:
            with self.autocast():
                loss = self.loss_fn(self.model(x), y)
            if len(batches) > 1:
                loss = loss / len(batches)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        return total

    def _train_step(self, batches):
        loss = self._micro_batches(batches)
        self._reduce_and_apply(loss)
        return loss

    def _apply_step(self) -> None:
        self._reduce_and_apply(self._loss)
        self.optimizer.zero_grad()

    def _reduce_and_apply(self, loss) -> None:
        """Horovod's allreduce and the update. With nan_guard the step's loss is averaged over the
        ranks too, queued after the gradients' allreduces (the same Horovod cycle, 4 more bytes).
        With clip_grad_norm or fp16 the step is Horovod's documented split: synchronize(), then
        unscale (fp16), the reduced gradient's norm and clipping (device tensors, no host sync),
        then step() under skip_synchronize(). Adasum reduces updates, not gradients: its step stays
        whole (clipping and fp16 are refused with it)."""
        handle = None
        if self.reduces_loss and self.size > 1:
            handle = self.hvd.allreduce_async(loss.float().reshape(1), op=self.hvd.Average, name="toolkit.step_loss")
        if (self.measures_norm or self.scaler) and self.config.op is not Op.ADASUM:
            self._split_step()
        else:
            self.optimizer.step()
        if self.reduces_loss:
            self.step_loss = self.hvd.synchronize(handle) if handle is not None else loss

    def _split_step(self) -> None:
        self.optimizer.synchronize()
        if self.scaler:     # fp16: the reduced gradient unscaled before it is measured and clipped
            self.scaler.unscale_(self.optimizer)
        if self.measures_norm:
            params = [p for p in self._trainable() if p.grad is not None]
            self.grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            torch.nn.utils.clip_grads_with_norm_(params, self.config.clip_grad_norm, self.grad_norm)
        with self.optimizer.skip_synchronize():
            if self.scaler:     # an overflow skips the step (the same on every rank) and lowers the scale
                scale = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.step_skipped = self.scaler.get_scale() < scale
            else:
                self.optimizer.step()

    def _trainable(self) -> list:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def array_ops(self):
        """Where the toolkit's exchange runs (toolkit/arrays.py): on a GPU, torch tensors on it (no host
        copy); on the CPU, numpy views of the same memory (no copy either; numpy's single-thread
        kernels measured faster than torch's for top-k's selection, docs/COMMUNICATION.md)."""
        if self._array_ops is None:
            from toolkit import arrays
            self._array_ops = (arrays.Torch(self.torch_device) if self.torch_device.type == "cuda"
                               else arrays.numpy_ops())
        return self._array_ops

    def local_gradients(self, batches=None):
        """This rank's gradients, tensors on its device (zeros for a parameter without one)."""
        loss = self._micro_batches(batches) if batches is not None else None
        grads = [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in self._trainable()]
        return loss, grads

    def apply_gradients(self, grads) -> None:
        for p, g in zip(self._trainable(), grads):
            p.grad = g.to(p.device, p.dtype) if torch.is_tensor(g) else torch.from_numpy(np.ascontiguousarray(g)).to(p.device)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def weights(self) -> list:
        """Copies (a CPU tensor's numpy() would share its memory and change with the next step)."""
        return [p.detach().cpu().numpy().copy() for p in self._trainable()]

    @torch.no_grad()
    def set_weights(self, arrays) -> None:
        for p, a in zip(self._trainable(), arrays, strict=True):
            p.copy_(torch.from_numpy(a))

    def _state_tensors(self) -> list:
        params = self._trainable()
        slots = [self.optimizer.state[p] for p in params]
        return params + [s[k] for s in slots for k in sorted(s) if torch.is_tensor(s[k])]

    def get_state(self) -> list:
        return [t.detach().cpu().numpy() for t in self._state_tensors()]

    @torch.no_grad()
    def set_state(self, arrays) -> None:
        for t, a in zip(self._state_tensors(), arrays, strict=True):
            t.copy_(torch.from_numpy(a))

    def _buffers(self) -> list:
        return [b.detach().cpu().numpy() for b in self.model.buffers() if b.is_floating_point()]

    @torch.no_grad()
    def _set_buffers(self, arrays) -> None:
        for b, a in zip([b for b in self.model.buffers() if b.is_floating_point()], arrays, strict=True):
            b.copy_(torch.from_numpy(np.asarray(a, np.float32)).to(b.dtype))

    @torch.no_grad()
    def _evaluate_batch(self, x, y):
        with self.autocast():
            out = self.model(x).float()
        loss = float(self.loss_fn(out, y)) * len(y)
        if out.dim() == 2 and not y.is_floating_point() and y.dim() == 1:
            return np.array([loss, int((out.argmax(1) == y).sum()), len(y), 0], np.float64)
        return np.array([loss, 0, len(y), 1], np.float64)

    # -- checkpoints, elastic, uneven data ----------------------------------------------------------------
    def _save_objects(self, folder: Path) -> None:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()      # fp16's loss scale, for an exact resume
        torch.save(state, folder / STATE_FILE)

    def _load_objects(self, folder: Path) -> None:
        state = torch.load(folder / STATE_FILE, map_location=self.torch_device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def snapshot(self):
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})

    def restore(self, snapshot) -> None:
        self.model.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])

    def join(self) -> int:
        return self.hvd.join()

    def replica_parameters(self) -> list[list]:
        return [[v.detach().cpu().numpy() for v in self.model.state_dict().values()]]

    # -- collectives on numpy arrays (returned as numpy) or on tensors (returned as tensors, on their device) --
    def allreduce(self, array, average: bool = True, name: str | None = None):
        tensor = array if torch.is_tensor(array) else torch.from_numpy(np.ascontiguousarray(array))
        out = self.hvd.allreduce(tensor, op=self.hvd.Average if average else self.hvd.Sum, name=name)
        return out if torch.is_tensor(array) else out.numpy()

    def allgather(self, array):
        tensor = array if torch.is_tensor(array) else torch.from_numpy(np.ascontiguousarray(array))
        out = self.hvd.allgather(tensor)
        return out if torch.is_tensor(array) else out.numpy()

