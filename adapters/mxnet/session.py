"""MXNet Gluon's tensor work for the session (adapters/base.py, the facade).

MXNet 1.9.1 is the last release (the project is retired upstream). How gradients move is the
strategy's (adapters/mxnet/strategies/horovod.py: Horovod's DistributedTrainer, plus the
accumulation and op its API lacks); bf16 is adapters/mxnet/precision.py (AMP). The session's
optimizer is Gluon's Trainer (what a Gluon user steps). A Gluon loss gives one value per sample:
`backward(loss)` counts them. Loaders: numpy arrays, or a Gluon `Dataset` read by Gluon's
DataLoader with the toolkit's sampler as its batch sampler.

A model whose shapes Gluon defers (layers without in_units / in_channels) finishes its setup at its
first forward pass: adapters/mxnet/deferred.py.
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import toolkit.shims.toolkit_numpy_compat  # noqa: F401  numpy.bool for MXNet on numpy 1.26, before `import mxnet`
from toolkit.adapters import batches as batches_module
from toolkit.adapters.base import Session
from toolkit.adapters.horovod import threads_per_rank
from toolkit.adapters.mxnet.precision import Precision
from toolkit.adapters.mxnet.precision import float32 as _float32
from toolkit.adapters.parts import part_own
from toolkit.config import PS_SYNCS, Optimizer
from toolkit.data.batch import map_structure
from toolkit.errors import ToolkitError
from toolkit.exchange import numerics

if TYPE_CHECKING:
    from toolkit.adapters.mxnet.strategies.common import MxnetStrategy

# MXNet sizes its OpenMP pool when it starts: share the cores between the ranks on this host first.
os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank()))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

from toolkit.adapters.mxnet.deferred import DeferredShapes  # noqa: E402  (imports mxnet: after the threads are set)

PARAMS_FILE = "model.params"
STATES_FILE = "trainer.states"


def part_files(index: int) -> tuple[str, str]:
    """A checkpoint's files of the index-th model set up: model.params and trainer.states for the first,
    model1.params and trainer1.states for the second, ..."""
    if index == 0:
        return PARAMS_FILE, STATES_FILE
    return f"model{index}.params", f"trainer{index}.states"


class MxnetSession(DeferredShapes, Session):
    name = "mxnet"
    strategy: MxnetStrategy
    params = part_own("params")      # the model's Gluon ParameterDict (per model: several models, a GAN's two)
    accumulate = False      # gradients add up in .grad (set by the strategy's wrap)
    _samples = 0
    _loss: Any              # the step's summed micro-batch losses (backward)

    @property
    def ctx(self):
        return self.strategy.ctx

    def _make_precision(self):
        # bf16: AMP, before any model is built
        return Precision(self.config.precision.value, on_cpu=self.ctx.device_type == "cpu")

    random_restorable = False       # MXNet's generator cannot be read back: resume reseeds

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        mx.random.seed(seed)

    # -- the user's objects -------------------------------------------------------------------------
    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        from toolkit.adapters.mxnet import models
        return models.build(self.config, num_features, num_classes, input_shape)

    def _place(self, model):
        if not isinstance(model, gluon.Block):
            raise ToolkitError(f"session.setup(model): expected a Gluon Block, got {type(model).__name__}")
        params = model.collect_params()
        if all(p._data is None and p._deferred_init == () for p in params.values()):
            model.initialize(mx.init.Xavier(), ctx=self.ctx)
        else:
            model.collect_params().reset_ctx(self.ctx)
        self.params = params
        if len(self.parts) > 1 and not self.parameter_shapes():
            raise ToolkitError("session.setup(model) of a second model whose shapes Gluon defers: several models "
                               "need their shapes at setup; give the layers in_units/in_channels")
        if not self.parameter_shapes():
            if self.config.sync in PS_SYNCS:
                name = next(name for name, p in params.items() if p._data is None)
                raise ToolkitError(f"session.setup(model): parameters of unknown shape ({name}, ...: Gluon's deferred "
                                   f"initialisation) with sync={self.config.sync.value}: the parameter server shards "
                                   "the parameters at setup; give the layers in_units/in_channels")
            self._first_call = model.register_forward_pre_hook(self._finish_setup)
        return model

    def _refuse_another_model(self) -> None:
        if not self.shapes_known:
            raise ToolkitError("session.setup() of a second model while the first one's shapes are deferred "
                               "(Gluon's deferred initialisation): several models need their shapes at setup; "
                               "give the first model's layers in_units/in_channels")
        super()._refuse_another_model()

    def has_gradients(self, part) -> bool:
        """Whether the last backward pass wrote gradients of `part`'s model no step used (Gluon's own
        `_fresh_grad` flag, which its Trainer clears when it updates)."""
        return any(d._fresh_grad for p in part.own["params"].values() if p.grad_req != "null" for d in p.list_data())

    def trainable(self) -> list:
        """The parameters the optimizer trains (grad_req not null)."""
        return [p for p in self.params.values() if p.grad_req != "null"]

    def _make_optimizer(self, model):
        c = self.config
        if c.optimizer is Optimizer.SGD:
            return mx.optimizer.create("sgd", learning_rate=c.lr, momentum=c.optimizer_momentum, wd=c.weight_decay)
        return mx.optimizer.create("adam", learning_rate=c.lr, wd=c.weight_decay)

    def _cross_entropy(self, logits, labels):
        return self._softmax_ce(_float32(logits), labels)

    _softmax_ce = gluon.loss.SoftmaxCrossEntropyLoss()

    def set_lr(self, lr: float) -> None:
        self.optimizer.set_learning_rate(lr)

    # -- data ---------------------------------------------------------------------------------------
    dataset_kind = "a Gluon Dataset"

    def _dataset_length(self, data):
        return len(data) if isinstance(data, gluon.data.Dataset) else None

    def _is_stream(self, data) -> bool:
        """An iterable of samples that is neither numpy arrays nor a Gluon Dataset (a generator, a reader)."""
        return hasattr(data, "__iter__") and not isinstance(data, (gluon.data.Dataset, tuple, list, dict, str, bytes,
                                                                    np.ndarray))

    def _stream_batches(self, data, batch_size, drop_last, batchify_fn=None, **reader):
        if reader:
            raise ToolkitError(f"session.loader(stream, {', '.join(reader)}=...): a stream takes batchify_fn only")
        batchify = _with_dicts(batchify_fn or gluon.data.dataloader.default_batchify_fn)
        samples = iter(data)
        while chunk := [s for _, s in zip(range(batch_size), samples)]:
            if drop_last and len(chunk) < batch_size:
                return
            yield map_structure(self.to_device, batchify(chunk))

    def _tensor(self, array):
        return mx.nd.array(array, ctx=self.ctx, dtype=array.dtype)

    def _dataset_batches(self, data, plan, sampler, **reader):
        """Gluon's DataLoader over the plan's batches, each as it yields it (a list for samples of any
        number of fields, a dict for dict samples) with its arrays on this rank's device; `reader`:
        the user's DataLoader options (batchify_fn, num_workers, ...), over the config's."""
        options = {"num_workers": self.config.loader_workers, **reader}
        if options.get("batchify_fn") is None:
            options["batchify_fn"] = _with_dicts(gluon.data.dataloader.default_mp_batchify_fn
                                                 if options["num_workers"] else
                                                 gluon.data.dataloader.default_batchify_fn)
        batches = gluon.data.DataLoader(data, batch_sampler=[idx.tolist() for idx in plan], **options)
        for batch in batches:
            yield map_structure(self.to_device, batch)

    def to_device(self, value):
        return value.as_in_context(self.ctx) if isinstance(value, mx.nd.NDArray) else value

    # -- the step -----------------------------------------------------------------------------------
    def backward(self, loss, tape=None) -> None:
        """`loss` as Gluon's losses give it, one value per sample (or a mean: one value)."""
        self._new_backward()
        self.precision.backward(loss)
        # / samples: the step's mean; kept until the next step's first backward (every model it reached steps on it)
        self._samples = int(loss.size) + (self._samples if self.micro else 0)
        self._loss = loss.sum() if self.micro == 0 else self._loss + loss.sum()
        self.micro += 1

    def _micro_batches(self, batches):
        """The micro-batches' gradients added into .grad; (mean loss as an NDArray, samples)."""
        total, samples = None, 0
        for batch in batches:
            with autograd.record():
                loss = batches_module.loss_of(self, batch)
            self.precision.backward(loss)
            part = loss.mean()
            total = part if total is None else total + part
            samples += int(loss.size)
        return total / len(batches), samples

    def _train_step(self, batches):
        loss, samples = self._micro_batches(batches)
        self._reduce_and_apply(samples, loss)      # mean over all micro-batches, allreduced
        self._zero_grad()
        return loss

    def _apply_step(self) -> None:
        self._reduce_and_apply(self._samples, self._loss / self._samples)
        self._zero_grad()

    def _reduce_and_apply(self, samples: int, loss) -> None:  # type: ignore[override]  # this session's steps call it
        """The facade's step with the Trainer's batch: the gradient applied is .grad x `_scale` / batch
        (the Trainer's rescale_grad; Horovod folds 1/size into `_scale` when it averages)."""
        super()._reduce_and_apply(loss, batch=samples * self.strategy.step_divisor)

    def _clip_gradients(self, max_norm: float, batch: float):  # type: ignore[override]  # the facade passes batch
        """The reduced gradient's norm as it will be applied (x `_scale` / batch), and .grad clipped."""
        grads = [p.grad(self.ctx) for p in self.trainable()]
        scale = self.optimizer._scale / batch
        norm = float(mx.nd.add_n(*[(g * g).sum() for g in grads]).sqrt().asscalar()) * scale
        if (factor := numerics.clip_factor(norm, max_norm)) is not None:
            for g in grads:
                g *= factor
        return norm

    def _zero_grad(self) -> None:
        if self.accumulate:
            for p in self.trainable():
                p.zero_grad()

    def local_gradients(self, batches=None):
        loss, samples = self._micro_batches(batches) if batches is not None else (None, self._samples)
        grads = [p.grad(self.ctx).asnumpy() / samples for p in self.trainable()]
        self._zero_grad()
        return (self.to_float(loss) if loss is not None else None), grads

    def apply_gradients(self, grads) -> None:
        for p, g in zip(self.trainable(), grads):
            p.grad(self.ctx)[:] = mx.nd.array(g, ctx=self.ctx, dtype=g.dtype)
        self.optimizer.step(1)
        self._zero_grad()

    def weights(self) -> list:
        """The trainable parameters; none while Gluon still defers their shapes."""
        if not self.shapes_known:
            return []
        return [p.data(self.ctx).asnumpy() for p in self.trainable()]

    def set_weights(self, arrays) -> None:
        for p, a in zip(self.trainable(), arrays, strict=True):
            p.set_data(mx.nd.array(a, ctx=self.ctx, dtype=a.dtype))

    def _state_arrays(self) -> list:
        arrays = [p.data(self.ctx) for p in self.trainable()]
        states = self.optimizer._updaters[0].states     # optimizer slots by parameter index, made at the first step
        for index in sorted(states):
            state = states[index]
            arrays += [a for a in (state if isinstance(state, (tuple, list)) else [state]) if a is not None]
        return arrays

    def get_state(self) -> list:
        return [a.asnumpy() for a in self._state_arrays()]

    def set_state(self, arrays) -> None:
        for target, a in zip(self._state_arrays(), arrays, strict=True):
            target[:] = mx.nd.array(a, ctx=self.ctx, dtype=a.dtype)

    def _statistics(self) -> list:
        return [p for p in self.params.values() if p.grad_req == "null" and np.issubdtype(p.dtype, np.floating)]

    def _buffers(self) -> list:
        if not self.shapes_known:       # nothing measured yet, on any rank
            return []
        return [p.data(self.ctx).asnumpy() for p in self._statistics()]

    def _set_buffers(self, arrays) -> None:
        for p, a in zip(self._statistics(), arrays, strict=True):
            p.set_data(mx.nd.array(a, ctx=self.ctx, dtype=p.dtype))

    def _evaluate_batch(self, x, y):
        out = _float32(self.model(x))
        loss = self.loss_fn(out, y)
        total = float(loss.sum().asscalar()) * (len(y) if loss.size == 1 else 1)
        if len(out.shape) == 2 and len(y.shape) == 1:
            correct = int((out.argmax(axis=1) == y.astype("float32")).sum().asscalar())
            return np.array([total, correct, len(y), 0], np.float64)
        return np.array([total, 0, len(y), 1], np.float64)

    def _drain(self) -> None:
        mx.nd.waitall()     # the next step's allreduces are queued on every rank: finish them before exiting

    # the guard's values end named allreduces (the step's loss over the ranks); MXNet's engine keeps them in
    # flight until read, and Horovod refuses a second one of the same name: read one step late
    guard_window = 1

    any_batch = True            # the built-in step's batches of any structure (adapters/batches.py)

    def call_model(self, batch):
        """A tuple's first field; anything else (a dict, one array) as it is: a Gluon block's forward takes
        positional arguments only."""
        return self.model(batch[0] if isinstance(batch, (tuple, list)) else batch)

    def to_float(self, value) -> float:
        """A host float; a loss of one value per sample (Gluon's losses): its mean."""
        if not hasattr(value, "asscalar"):
            return float(value)
        return float((value if value.size == 1 else value.mean()).asscalar())   # no extra op for one value

    # -- checkpoints ----------------------------------------------------------------------------------
    def _save_objects(self, folder: Path) -> None:
        if not self.shapes_known:
            raise self._unknown_shapes("session.save()")
        for index, part in enumerate(self.parts):
            params, states = part_files(index)
            part.model.save_parameters(str(folder / params))
            part.optimizer.save_states(str(folder / states))

    def _load_objects(self, folder: Path) -> None:
        saved = len(list(folder.glob("model*.params")))
        if saved != len(self.parts):
            raise ToolkitError(f"checkpoint {folder} holds {saved} model(s), this session set up {len(self.parts)}; "
                               "resume with the models it was saved with")
        for index, part in enumerate(self.parts):
            params, states = part_files(index)
            with self._using(part):
                self.model.load_parameters(str(folder / params), ctx=self.ctx)
                self.load_trainer_states(str(folder / states))

    def load_trainer_states(self, path: str) -> None:
        """The Trainer's states from `path` (momentum, the optimizer's update counts, its lr_scheduler),
        into the optimizer object the user holds. Trainer.load_states swaps in an unpickled copy of
        the optimizer, so the user's optimizer and scheduler would stop being the ones that train
        (after setup's broadcast every rank but 0 kept reading its first learning rate, and its
        set_learning_rate changed nothing); the state goes into them in place, as MXNet's own
        Optimizer.__setstate__ fills an optimizer."""
        trainer = self.optimizer
        mine = trainer._optimizer
        trainer.load_states(path)
        loaded = trainer._optimizer
        if loaded is mine:
            return
        schedule = mine.lr_scheduler
        mine.__dict__.update({k: v for k, v in loaded.__dict__.items() if k != "param_dict"})
        if schedule is not None and loaded.lr_scheduler is not None:
            schedule.__dict__.update(loaded.lr_scheduler.__dict__)
            mine.lr_scheduler = schedule
        trainer._optimizer = mine
        for updater in trainer._updaters:
            updater.optimizer = mine

    def replica_parameters(self) -> list[list]:
        """This rank's parameters and statistics, every model's in setup order; none while Gluon still
        defers their shapes."""
        if not self.shapes_known:
            return []
        return [[p.data(self.ctx).asnumpy() for part in (self.parts or [self.part]) for p in part.own["params"].values()]]


def _with_dicts(batchify):
    """Gluon's batchify for samples of fields, taking dict samples too (Hugging Face's form: a dict
    of arrays per sample, batched key by key); Gluon's own turns a list of dicts into an object array."""
    def batchify_samples(samples):
        if isinstance(samples[0], dict):
            return {key: batchify_samples([s[key] for s in samples]) for key in samples[0]}
        if isinstance(samples[0], tuple):
            return [batchify_samples(list(field)) for field in zip(*samples)]
        return batchify(samples)
    return batchify_samples
