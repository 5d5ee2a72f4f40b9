"""What each framework's session provides to the facade (adapters/base.py): the tensor work.

A framework's session (adapters/<framework>/session.py) subclasses the facade and fills these in:
the model on this rank's device, the config's optimizer and loss, its dataset and tensors, the
backward pass, gradients and state as arrays, evaluation of one batch, its files in a checkpoint.
Nothing here moves data between ranks (the strategy's, adapters/strategy.py) or chooses a precision
(adapters/<framework>/precision.py).
"""
from __future__ import annotations

import abc
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from toolkit.adapters import randomness
from toolkit.adapters.topology import Topology
from toolkit.data.batch import arrays_length, map_structure
from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.adapters.strategy import Strategy
    from toolkit.config import Config


# The readers' options that choose which samples form a batch: the session's sampler decides that.
_SESSIONS_OWN = {"batch_size", "shuffle", "sampler", "batch_sampler", "last_batch", "drop_last"}


class TensorWork(abc.ABC):
    config: Config
    strategy: Strategy

    def _drain(self) -> None:
        """Wait for the framework's queued work (MXNet's engine runs asynchronously)."""

    def _clip_gradients(self, max_norm: float, batch=None):
        """The reduced gradients' global norm, and the gradients clipped to `max_norm` (the framework's)."""
        raise NotImplementedError(f"{type(self).__name__} clips inside its own step")

    def _make_precision(self):
        """The framework's precision object for the config (adapters/<framework>/precision.py)."""
        return None

    def to_float(self, value) -> float:
        """A loss from train_step (a device tensor: no host sync until asked) as a Python float."""
        return float(value)

    guard_window = 1 << 30      # the most steps the NaN guard leaves unread (MXNet: 1, read one step late)

    def compile_report(self) -> str | None:
        """After the first step, what compiling the model did (torch.compile's graph breaks), or None."""
        return None

    def to_floats(self, values: list) -> list[float]:
        """Several such values as Python floats (where the framework can: one host read for all of them)."""
        return [self.to_float(v) for v in values]

    def device_name(self) -> str | None:
        """The accelerator's name as its driver gives it (a GPU's, for its peak FLOP/s), None on the CPU."""
        return None

    def throughput_basis(self, batch) -> tuple[float | None, int | None]:
        """(model FLOPs of training on one sample, tokens in one sample) from one micro-batch, measured
        without changing anything the training computes; None where the framework gives no count
        (torch counts FLOPs; toolkit/run/throughput.py does the rest)."""
        from toolkit.adapters.batches import token_length
        return None, token_length(batch)

    def has_gradients(self, part) -> bool:
        """Whether a backward pass gave `part`'s model gradients that no step used yet (several models)."""
        return True

    def _buffers(self) -> list:
        """The model's floating-point state that is not trained (numpy); [] if none."""
        return []

    def _set_buffers(self, arrays) -> None:
        pass

    def _train_mode(self, training: bool) -> None:
        """Put the setup model in training or inference mode (dropout, BatchNorm)."""

    @abc.abstractmethod
    def builtin_model(self, num_features: int, num_classes: int, input_shape: tuple | None = None):
        """The config's built-in model (mlp, linear, resnet18, resnet50, transformer_lm) in this
        framework (adapters/<framework>/models.py); `input_shape`: one sample's, for the ResNets."""

    def _start(self, comm=None) -> Topology:
        """The strategy's start: init, threads and the device of this local rank."""
        return self.strategy.start(comm)

    @abc.abstractmethod
    def _seed(self, seed: int) -> None: ...

    # the framework's random generators in checkpoints (adapters/randomness.py has Python's and numpy's)
    random_restorable = True        # False: its generator cannot be read back (MXNet): resume reseeds

    def _framework_random(self) -> dict:
        """This rank's framework generators as JSON (lists, base64 strings)."""
        return {}

    def _set_framework_random(self, state: dict) -> None:
        """The framework's generators set back to what `_framework_random` returned."""

    def random_state(self) -> dict:
        """This rank's random generators (Python's, numpy's, the framework's) as JSON."""
        return randomness.capture(self._framework_random())

    def set_random_state(self, state: dict) -> None:
        self._set_framework_random(state)       # first: making a generator may draw from Python's (Keras's does)
        randomness.restore(state)

    @abc.abstractmethod
    def _place(self, model):
        """The model on this rank's device (built under the strategy's scope where there is one)."""

    @abc.abstractmethod
    def _make_optimizer(self, model):
        """The config's optimizer for `model` (sgd with momentum, or adam; lr; weight_decay)."""

    @abc.abstractmethod
    def _cross_entropy(self, logits, labels):
        """The default loss: mean cross-entropy of integer labels on logits."""

    @abc.abstractmethod
    def set_lr(self, lr: float) -> None: ...

    dataset_kind = "the framework's dataset"       # said when a loader gets something else

    def _length(self, data) -> int:
        """Samples in `data` (numpy columns or the framework's dataset); a one-line error for anything else."""
        n = arrays_length(data)
        if n is None:
            n = self._dataset_length(data)
        if n is None:
            raise ToolkitError(f"session.loader(data): expected numpy arrays of one length ((x, y), more fields, or "
                               f"a dict of them) or {self.dataset_kind}, got {type(data).__name__}")
        return n

    def _batches(self, data, plan, sampler, **reader):
        """An iterator of the batches on this rank's device made of `data`'s samples at each index
        array of `plan`, in order, their structure kept (a tuple of any arity, a dict): numpy columns
        indexed here, the framework's dataset read by its own reader with the `reader` options (a
        stream such as tf.data follows `sampler`'s epoch, position and shard)."""
        if arrays_length(data) is None:
            if refused := sorted(_SESSIONS_OWN & set(reader)):
                raise ToolkitError(f"session.loader(dataset, {', '.join(refused)}=...): which samples make a batch is "
                                   "the session's (batch_size=, shuffle= of session.loader); give the reader's other "
                                   "options (collate_fn, batchify_fn, num_workers, ...)")
            return self._dataset_batches(data, plan, sampler, **reader)
        if reader:
            raise ToolkitError(f"session.loader(numpy arrays, {', '.join(reader)}=...): reader options are for "
                               f"{self.dataset_kind}; numpy arrays are indexed directly")
        return (map_structure(lambda a: self._tensor(a[idx]), data) for idx in plan)

    def _is_stream(self, data) -> bool:
        """Whether `data` is a stream of samples of unknown length the framework reads (a torch
        IterableDataset, a tf.data stream without a cardinality, an iterable for MXNet)."""
        return False

    def _stream_batches(self, data, batch_size: int, drop_last: bool, **reader):
        """A user's stream in micro-batches of `batch_size` samples on this rank's device (training drops
        a last smaller one: every rank's micro-batches then weigh the same)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _dataset_length(self, data) -> int | None:
        """Samples in the framework's dataset `data`, None if `data` is not one."""

    @abc.abstractmethod
    def _dataset_batches(self, data, plan, sampler): ...

    @abc.abstractmethod
    def _tensor(self, array):
        """A numpy array as the framework's tensor on this rank's device."""

    @abc.abstractmethod
    def backward(self, loss, tape=None) -> None:
        """This micro-batch's gradients, added to the step's (the loss divided by accumulation_steps,
        so k micro-batches of b mean the same as one batch of k*b)."""

    @abc.abstractmethod
    def _evaluate_batch(self, x, y):
        """(sum of losses, correct, count) of the setup model on one batch."""

    @abc.abstractmethod
    def replica_parameters(self) -> list[list]:
        """Each replica's model state (parameters and buffers) as numpy arrays, in a fixed order."""

    def _gather_objects(self) -> None:
        """Before rank 0 alone writes a checkpoint: a collective, on every rank, that brings the state
        `_save_objects` writes to rank 0 where it is sharded across the ranks (torch's FSDP, ZeRO)."""

    @abc.abstractmethod
    def _save_objects(self, folder: Path) -> None:
        """Model and optimizer state into `folder` (toolkit.run.checkpoint makes it atomic)."""

    def _snapshot_objects(self) -> Callable[[Path], None]:
        """For a save in the background (`checkpoint_async`), on rank 0 after `_gather_objects`: the files
        `_save_objects` writes, copied into memory now (written into a temporary folder and read back); returns
        what writes them into the checkpoint's folder later, while training goes on. torch keeps tensors instead."""
        import tempfile
        with tempfile.TemporaryDirectory(prefix="toolkit-snapshot-") as tmp:
            self._save_objects(Path(tmp))
            files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}

        def write(folder: Path) -> None:
            for name, data in files.items():
                (folder / name).write_bytes(data)
        return write

    @abc.abstractmethod
    def _load_objects(self, folder: Path) -> None: ...

    @property
    def shards_on_every_rank(self) -> bool:
        """checkpoint_format sharded: every rank writes and reads its own shards (torch on torch.distributed)."""
        return False

    def write_shards(self, folder: Path, background: bool = False) -> Callable[[], None]:
        """A collective where `shards_on_every_rank`: this rank's shards of the state into `folder` (`background`:
        copied now, written in a thread); returns what waits for the write."""
        raise NotImplementedError

    def wait_shards(self) -> None:
        """This rank's shards of a save in the background written (nothing where there is none)."""

    def read_shards(self, folder: Path) -> None:
        """A collective where `shards_on_every_rank`: this rank's shards of the state from `folder`."""
        raise NotImplementedError

    def _inference(self):
        """The context a user's evaluation metric runs in (torch: no_grad)."""
        import contextlib
        return contextlib.nullcontext()

    any_batch = False       # train_step and evaluate take batches of any structure (adapters/batches.py)

    def call_model(self, batch):
        """The model on a batch that is not (x, y) (where `any_batch`): the framework's way of calling it."""
        raise NotImplementedError

    # Communication's primitives (toolkit/exchange/communication.py): the step, split where the toolkit's
    # exchange comes in.
    @abc.abstractmethod
    def _train_step(self, batches) -> float:
        """Forward, backward and Horovod's reduce-and-apply over the micro-batches; local mean loss."""

    @abc.abstractmethod
    def _apply_step(self) -> None:
        """After backward() of every micro-batch: Horovod's reduce-and-apply, gradients cleared."""

    @abc.abstractmethod
    def local_gradients(self, batches=None) -> tuple[float | None, list]:
        """This rank's gradients as numpy arrays in a fixed order, no communication: computed over
        `batches` (their mean loss returned), or, with None, the ones backward() accumulated."""

    @abc.abstractmethod
    def apply_gradients(self, grads: list) -> None:
        """One local optimizer step with these numpy gradients (order as local_gradients)."""

    def get_state(self) -> list:
        """What local SGD averages: the trainable parameters and the optimizer's slots, as numpy arrays."""
        raise NotImplementedError(f"{type(self).__name__} has no local SGD (see toolkit/registry.py)")

    def set_state(self, arrays: list) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no local SGD (see toolkit/registry.py)")

    # -- the parameter server's workers (toolkit/run/ps.py) --------------------------------------------------
    def weights(self) -> list:
        """The trainable parameters as numpy arrays, in local_gradients order."""
        raise NotImplementedError(f"{type(self).__name__} has no parameter server (see toolkit/registry.py)")

    def set_weights(self, arrays) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no parameter server (see toolkit/registry.py)")

    # -- elastic training, where the registry marks it ----------------------------------------------
    def snapshot(self):
        """An in-memory copy of model and optimizer state (what an elastic commit keeps)."""
        raise NotImplementedError(f"{type(self).__name__} has no elastic training (see toolkit/registry.py)")

    def restore(self, snapshot) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no elastic training (see toolkit/registry.py)")
