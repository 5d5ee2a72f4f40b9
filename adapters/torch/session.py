"""PyTorch's tensor work for the session (adapters/base.py, the facade): the user's module on this
rank's device, the config's optimizer and loss, loaders, the backward pass, gradients and state as
tensors, evaluation, checkpoints. How gradients and state move between the ranks is the strategy's
(adapters/torch/strategies/: horovod, native), which may wrap the model (DDP) or shard it (FSDP2, ZeRO):
the session reads the user's module and the whole state through it (`unwrap`, `full_state`), so a
checkpoint has one format under every strategy; the precision (autocast, GradScaler) is
adapters/torch/precision.py.
Loaders: numpy arrays are indexed directly; a `torch.utils.data.Dataset` is read by torch's own
DataLoader (workers, pinned memory on a GPU, the user's `collate_fn`) with the toolkit's sampler as
its batch sampler: samples may be tuples of any arity or dicts (Hugging Face's `input_ids`,
`attention_mask`, `labels`), as the DataLoader takes them. Several models may share a session (a
GAN): one checkpoint file holds them all.
"""
from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from toolkit.adapters import batches as batches_module
from toolkit.adapters import randomness
from toolkit.adapters.base import Session
from toolkit.adapters.torch import sharded, staging
from toolkit.adapters.torch.precision import Precision
from toolkit.config import CheckpointFormat, Optimizer
from toolkit.data.batch import leading_size, map_structure
from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.adapters.torch.strategies.common import TorchStrategy

STATE_FILE = "state.pt"


class TorchSession(Session):
    name = "torch"
    strategy: TorchStrategy
    _array_ops = None
    _loss: Any                  # the step's summed micro-batch losses (backward)
    _saving: Any                # the parts' whole states, from _gather_objects to _save_objects
    _shards_written: Any = None  # checkpoint_async, sharded on every rank: what waits for this rank's write
    _staged: Any = None         # checkpoint_async: the host copy the save before was written from (staging.py)

    @property
    def torch_device(self) -> torch.device:
        return self.strategy.device

    def _make_precision(self):
        return Precision(self.config.precision.value, self.torch_device)

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _framework_random(self) -> dict:
        cuda = ([randomness.encode(s.numpy()) for s in torch.cuda.get_rng_state_all()]
                if torch.cuda.is_available() and torch.cuda.is_initialized() else [])
        return {"torch": randomness.encode(torch.get_rng_state().numpy()), "cuda": cuda}

    def _set_framework_random(self, state: dict) -> None:
        torch.set_rng_state(torch.from_numpy(randomness.decode(state["torch"], np.uint8)))
        if state.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.from_numpy(randomness.decode(s, np.uint8)) for s in state["cuda"]])

    _streams_read = 0

    def _loader_generator(self, epoch: int) -> torch.Generator:
        """The DataLoader's own generator (its workers' base seed), seeded by (seed, epoch, rank): left to
        itself each DataLoader iterator draws from torch's global generator, so a resumed run's
        dropout and noise would follow other numbers than the uninterrupted run's."""
        return torch.Generator().manual_seed(randomness.reseed_value(self.config.seed, epoch, self.rank))

    # -- the user's objects -------------------------------------------------------------------------
    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        from toolkit.adapters.torch import models
        return models.build(self.config, num_features, num_classes, input_shape)

    def _place(self, model):
        if not isinstance(model, torch.nn.Module):
            raise ToolkitError(f"session.setup(model): expected a torch.nn.Module, got {type(model).__name__}")
        if hasattr(model, "_orig_mod") and self.strategy.wraps_module:
            # torch.compile'd: DDP and FSDP2 wrap the plain module, compiled after (torch's advice), in setup()
            model, self._compile_next = model._orig_mod, True
        if self.config.sync_batchnorm:      # batch statistics over every rank (the strategy's)
            model = self.strategy.sync_batchnorm(model)
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

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _train_mode(self, training: bool) -> None:
        self.model.train(training)

    # -- data ---------------------------------------------------------------------------------------
    dataset_kind = "a torch.utils.data.Dataset with a length"

    def _dataset_length(self, data):
        return len(data) if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__") else None

    def _is_stream(self, data) -> bool:
        return isinstance(data, torch.utils.data.IterableDataset)     # WebDataset pipelines are

    def _stream_batches(self, data, batch_size, drop_last, **reader):
        options = {"num_workers": self.config.loader_workers, "pin_memory": self.torch_device.type == "cuda",
                   "drop_last": drop_last, "generator": self._loader_generator(self._streams_read), **reader}
        self._streams_read += 1         # each pass its own workers' seeds, as each epoch of a dataset
        loader = torch.utils.data.DataLoader(data, batch_size=batch_size, **options)
        return (map_structure(self.to_device, batch) for batch in loader)

    def _tensor(self, array):
        return self.to_device(torch.from_numpy(array))

    def _dataset_batches(self, data, plan, sampler, **reader):
        """torch's DataLoader over the plan's batches; `reader`: the user's DataLoader options
        (collate_fn, num_workers, pin_memory, ...), over the config's defaults."""
        options = {"num_workers": self.config.loader_workers, "pin_memory": self.torch_device.type == "cuda",
                   "generator": self._loader_generator(getattr(sampler, "epoch", 0)), **reader}
        batches = torch.utils.data.DataLoader(data, batch_sampler=[idx.tolist() for idx in plan], **options)
        for batch in batches:
            yield map_structure(self.to_device, batch)

    any_batch = True

    def call_model(self, batch):
        """A dict's keys as keyword arguments (Hugging Face's way), a tuple's first field, a tensor as it is."""
        if isinstance(batch, Mapping):
            return self.model(**batch)
        return self.model(batch[0]) if isinstance(batch, (tuple, list)) else self.model(batch)

    def to_device(self, value):
        return value.to(self.torch_device, non_blocking=True) if torch.is_tensor(value) else value

    def device_name(self) -> str | None:
        return torch.cuda.get_device_name(self.torch_device) if self.torch_device.type == "cuda" else None

    def throughput_basis(self, batch) -> tuple[float | None, int | None]:
        """torch's FlopCounterMode over one forward pass of the setup model (the module under DDP, FSDP or
        compile: eager, inference mode, no gradient: BatchNorm's statistics, dropout and the random
        generators untouched) on `batch`; training costs three forward passes (the backward pass two).
        Tokens: the inputs' length where they are token ids (a [batch, T] integer tensor). Every rank
        runs it (FSDP's forward gathers its shards)."""
        from torch.utils.flop_counter import FlopCounterMode
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
        model = self.strategy.unwrap(self.model)
        training = model.training
        model.eval()
        counter = FlopCounterMode(display=False)
        try:
            with torch.no_grad(), counter, self.autocast():
                model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
        finally:
            model.train(training)
        size = leading_size(batch)
        flops = 3 * counter.get_total_flops() / size if size else None
        return flops or None, batches_module.token_length(batch)

    def _inference(self):
        return torch.no_grad()

    def compile_report(self) -> str | None:
        """After the first step: what torch.compile did (graph breaks, once), or None without compile."""
        if not any(hasattr(p.model, "_orig_mod") or getattr(p.model, "_compiled_call_impl", None) for p in self.parts):
            return None
        from torch._dynamo.utils import counters
        breaks = counters["graph_break"]
        reasons = "; ".join(f"{why.splitlines()[0]} (x{n})" for why, n in breaks.most_common(3))
        return f"{sum(breaks.values())} graph break{'s' * (sum(breaks.values()) != 1)}" + (f": {reasons}" if reasons else "")

    def to_floats(self, values: list) -> list[float]:
        """Losses and norms (device tensors) read back in one host read."""
        if values and all(torch.is_tensor(v) for v in values):
            return torch.stack([v.detach().float().reshape(()) for v in values]).tolist()
        return super().to_floats(values)

    # -- the step -----------------------------------------------------------------------------------
    gradient_hooks = True       # the toolkit's exchange may start in buckets from gradient hooks (overlap)
    _compile_next = False       # compile the model setup() is placing, after the strategy wrapped it

    def setup(self, model, optimizer=None, loss=None):
        self._compile_next = self.config.compile
        out = super().setup(model, optimizer, loss)
        part = self.parts[-1]
        if self._compile_next and not hasattr(part.model, "_orig_mod"):
            part.model.compile()        # in place, after the strategy's wrapper: the same module, its names unchanged
            out = (part.model, part.optimizer)
        comm = part.communication
        if comm is not None and comm.overlapped:
            # overlap: each parameter's accumulated gradient to its bucket (toolkit/exchange/buckets.py)
            ops = self.array_ops
            for i, p in enumerate(p for p in part.model.parameters() if p.requires_grad):
                p.register_post_accumulate_grad_hook(
                    lambda p, i=i: comm.gradient_ready(i, ops.asarray(p.grad.detach())))
        return out

    def _before_pass(self, last: bool, parts) -> None:
        """Each model in `parts` told whether the coming pass is the step's last micro-batch (DDP/FSDP sync, overlap)."""
        for part in parts:
            with self._using(part):
                self.strategy.sync_gradients(self, last)
                if self.communication is not None:
                    self.communication.arm(last)

    def has_gradients(self, part) -> bool:
        return any(p.grad is not None for p in part.model.parameters())

    def backward(self, loss, tape=None) -> None:
        self._new_backward()
        k = self.config.accumulation_steps
        loss = loss / k if k > 1 else loss
        self._before_pass(self.micro == k - 1, self.parts)         # read by this backward (FSDP, overlap)
        self.precision.backward(loss)
        self._loss = loss.detach() if self.micro == 0 else self._loss + loss.detach()    # the step's mean loss
        self.micro += 1
        self._before_pass(self.micro % k == k - 1, self.parts)    # read by the next forward (DDP)

    def _micro_batches(self, batches):
        """Mean loss of the micro-batches (a device tensor, no host sync) with their gradients in .grad."""
        if not self.model.training:
            self.model.train()
        self.optimizer.zero_grad()
        total = None
        for i, batch in enumerate(batches):
            self._before_pass(i == len(batches) - 1, [self.part])     # accumulation: the last one reduces
            with self.autocast():
                loss = batches_module.loss_of(self, batch)
            if len(batches) > 1:
                loss = loss / len(batches)
            self.precision.backward(loss)
            total = loss.detach() if total is None else total + loss.detach()
        return total

    def _train_step(self, batches):
        loss = self._micro_batches(batches)
        self._reduce_and_apply(loss)
        return loss

    def _apply_step(self) -> None:
        self._reduce_and_apply(self._loss)
        self.optimizer.zero_grad()

    def _clip_gradients(self, max_norm: float, batch=None):
        """The reduced gradient's norm (a device tensor, no host sync), and the gradients clipped to max_norm."""
        params = [p for p in self._trainable() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm     # FSDP: a DTensor

    def _trainable(self) -> list:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def array_ops(self):
        """Where the toolkit's exchange runs (toolkit/exchange/arrays.py): torch tensors on this rank's device, the
        CPU included, so the code a GPU runs is the code the CPU runs (and no value is read back to the host)."""
        if self._array_ops is None:
            from toolkit.exchange import arrays
            self._array_ops = arrays.Torch(self.torch_device)
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
        """Copies (a CPU tensor's numpy() would share its memory and change with the next step); a sharded
        parameter whole (a collective)."""
        return [_whole(p.detach()).cpu().numpy().copy() for p in self._trainable()]

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
        return [b.detach().cpu().numpy() for b in self.strategy.unwrap(self.model).buffers() if b.is_floating_point()]

    @torch.no_grad()
    def _set_buffers(self, arrays) -> None:
        buffers = [b for b in self.strategy.unwrap(self.model).buffers() if b.is_floating_point()]
        for b, a in zip(buffers, arrays, strict=True):
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
    @property
    def _sharded_format(self) -> bool:
        return self.config.checkpoint_format is CheckpointFormat.SHARDED

    @property
    def shards_on_every_rank(self) -> bool:
        """A sharded checkpoint is written and read by every rank (torch.distributed); else by rank 0 whole."""
        return sharded.every_rank(self.strategy)

    def _gather_objects(self) -> None:
        if self._sharded_format and self.shards_on_every_rank:
            self._saving = None         # every rank writes its own shards (write_shards)
            return
        self._saving = [self.strategy.full_state(part) for part in self.parts]   # a collective where sharded

    def write_shards(self, folder: Path, background: bool = False):
        self.wait_shards()
        if not background:
            sharded.save(self.parts, self.strategy, folder)
            return lambda: None
        self._shards_written = sharded.save_async(self.parts, self.strategy, folder)
        return self._shards_written

    def wait_shards(self) -> None:
        """This rank's shards of the save in the background written; their error is rank 0's to report (DCP gives
        every rank the same), through the checkpointer's wait."""
        wait, self._shards_written = self._shards_written, None
        if wait is not None:
            try:
                wait()
            except ToolkitError:
                pass

    def read_shards(self, folder: Path) -> None:
        sharded.load(self.parts, self.strategy, folder)

    def _state(self) -> dict:
        """What state.pt holds: the gathered parts' states, + fp16's loss scale for an exact resume; the second
        and later models under "parts". A sharded checkpoint's: its format and number of models (the states
        are DCP's files, adapters/torch/sharded.py)."""
        if self._sharded_format:
            return {"format": sharded.FORMAT, "models": len(self.parts), **self.precision.state_dict()}
        (first, *others), self._saving = self._saving, None
        state = {**first, **self.precision.state_dict()}
        if others:
            state["parts"] = others
        return state

    def _writer(self, copy: bool):
        """What writes state.pt (and a sharded checkpoint's whole state through rank 0) into a folder; `copy`
        (checkpoint_async): every tensor copied to host memory now (into the save before's copy), written later
        in the background."""
        whole, names = None, []
        if self._sharded_format and not self.shards_on_every_rank:     # rank 0 alone: the whole state, as DCP's
            whole, self._saving = self._saving, None
            names = [sharded.names(p, self.strategy) for p in self.parts]
        state = self._state()
        if copy:
            whole, state = self._staged = staging.host_copy((whole, state), self._staged)

        def write(folder: Path) -> None:
            if whole is not None:
                sharded.save_whole(whole, names, folder)
            torch.save(state, folder / STATE_FILE)
        return write

    def _save_objects(self, folder: Path) -> None:
        self._writer(copy=False)(folder)

    def _snapshot_objects(self):
        return self._writer(copy=True)

    def _load_objects(self, folder: Path) -> None:
        state = torch.load(folder / STATE_FILE, map_location=self.torch_device, weights_only=True)
        is_sharded = state.get("format") == sharded.FORMAT
        count = state["models"] if is_sharded else 1 + len(state.get("parts", []))
        if count != len(self.parts):
            raise ToolkitError(f"checkpoint {folder} holds {count} model(s), this session set up "
                               f"{len(self.parts)}; resume with the models it was saved with")
        if is_sharded and self.shards_on_every_rank:
            self.precision.load_state_dict(state)       # the models: every rank reads its shards (read_shards)
            return
        saved = sharded.load_whole(self.parts, self.strategy, folder) if is_sharded \
            else [state, *state.get("parts", [])]
        for part, part_state in zip(self.parts, saved):
            self.strategy.stash_loaded(part, part_state)      # loaded here, or given to the sharded broadcast
        self.precision.load_state_dict(state)

    def snapshot(self):
        return copy.deepcopy({"model": self.strategy.unwrap(self.model).state_dict(),
                              "optimizer": self.optimizer.state_dict()})

    def restore(self, snapshot) -> None:
        self.strategy.unwrap(self.model).load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])

    def replica_parameters(self) -> list[list]:
        """Every model's state (parameters and buffers), the models in setup order; a sharded model whole
        (a collective: every rank gathers it)."""
        models = [self.strategy.unwrap(p.model) for p in self.parts] or [self.model]
        return [[_whole(v.detach()).cpu().numpy() for m in models for v in m.state_dict().values()]]


def _whole(tensor):
    """A sharded tensor (FSDP2's DTensor) gathered whole; others as they are."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
