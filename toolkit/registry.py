"""(framework, backend) -> the session class (the framework's tensor work) and its strategy class (how
gradients and state move: adapters/strategy.py), imported only when chosen, so `import toolkit` stays
light. A new backend is one strategy module and one row here.
The framework's own data modules (its image-folder and shard readers) are reached here too (`reader`).

Availability is decided here, once, from `importlib.util.find_spec` (no framework import).
What each implementation can do (ops, compressions) is declared here too and checked when the
config resolves, so a request a session cannot honour fails before any process starts.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field

from toolkit.errors import ToolkitError

ALL_OPS = ("average", "sum", "adasum")
# The one place that says which compressions Horovod runs inside its allreduce and which the toolkit's
# exchange runs (toolkit/exchange/compression.py, through the session's local_gradients/apply_gradients);
# the config's enum (toolkit/config/enums.py) and the planner derive theirs from these.
HOROVOD_COMPRESSIONS = ("none", "fp16")
TOOLKIT_COMPRESSIONS = ("bf16", "int8", "topk", "powersgd")
ALL_COMPRESSIONS = HOROVOD_COMPRESSIONS + TOOLKIT_COMPRESSIONS
ALL_SYNCS = ("every_step", "local_sgd", "async_ps", "ssp")
FP16_TORCH_ONLY = ("fp16 needs dynamic loss scaling around the allreduce, which the toolkit has for torch and for "
                   "Keras 3 on Horovod")


@dataclass(frozen=True)
class Implementation:
    session: str                                 # "module:Class": the framework's tensor work
    strategy: str                                # "module:Class": how gradients and state move
    ops: tuple[str, ...] = ALL_OPS               # Config.op values it implements
    compressions: tuple[str, ...] = ALL_COMPRESSIONS
    syncs: tuple[str, ...] = ALL_SYNCS
    why_not: str = ""                            # said when an op, compression or sync is refused
    elastic: bool = False                        # Horovod elastic (hvd.elastic.run) implemented
    join: bool = False                           # hvd.join() (uneven_data under sync every_step)
    why_not_elastic: str = "Horovod elastic needs the framework's State and run(); use torch or tensorflow"
    clip: str = ""                               # why clip_grad_norm is refused; "" = implemented
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16")
    sync_batchnorm: str = ""                     # why sync_batchnorm is refused; "" = implemented
    why_not_precision: str = ""
    models_refused: dict = field(default_factory=dict)   # built-in model -> why it is not built here
    sharding: tuple[str, ...] = ("none",)       # Config.sharding values it implements


@dataclass(frozen=True)
class AdapterSpec:
    package: str                # the framework's importable top-level package
    backends: dict[str, Implementation] = field(default_factory=dict)
    variants: dict[str, Implementation] = field(default_factory=dict)   # "backend/keras", when it differs

    def implementation(self, backend: str, keras: str = "keras3") -> Implementation:
        return self.variants.get(f"{backend}/{keras}") or self.backends[backend]


_ADAPTERS: dict[str, AdapterSpec] = {
    "torch": AdapterSpec("torch",
                         {"horovod": Implementation("toolkit.adapters.torch.session:TorchSession",
                                                    "toolkit.adapters.torch.strategies.horovod:TorchHorovod",
                                                    elastic=True, join=True),
                          "native": Implementation("toolkit.adapters.torch.session:TorchSession",
                                                   "toolkit.adapters.torch.strategies.native:TorchNative",
                                                   ops=("average",), syncs=("every_step", "local_sgd"),
                                                   why_not="DDP averages the gradients (no sum, no Adasum), and the "
                                                           "parameter server runs on Horovod's workers; use "
                                                           "backend: horovod",
                                                   join=True, sharding=("none", "zero1", "fsdp"))}),
    "tensorflow": AdapterSpec(
        "tensorflow",
        {"horovod": Implementation("toolkit.adapters.tensorflow.session:TensorflowSession",
                                   "toolkit.adapters.tensorflow.strategies.horovod:TensorflowHorovod", elastic=True),
         "native": Implementation("toolkit.adapters.tensorflow.native:NativeSession",
                                  "toolkit.adapters.tensorflow.strategies.native:TensorflowNative", ops=("average", "sum"),
                                  compressions=("none",), syncs=("every_step",),
                                  why_not="TensorFlow's collectives have neither Adasum nor compression, "
                                          "and the strategies step in sync; use backend: horovod for them",
                                  clip="Keras 3 under a strategy clips each replica's gradient before the "
                                       "all-reduce, not the reduced one",
                                  precisions=("fp32", "bf16"), why_not_precision=FP16_TORCH_ONLY)},
        variants={"horovod/tf_keras": Implementation(
            "toolkit.adapters.tensorflow.tf_keras:TfKerasSession",
            "toolkit.adapters.tensorflow.strategies.tf_keras:TfKerasHorovod", compressions=HOROVOD_COMPRESSIONS, syncs=("every_step",),
            why_not="tf-keras trains through Horovod's own DistributedOptimizer, which has only fp16; "
                    "the toolkit's compressions and local SGD run with keras: keras3",
            why_not_elastic="elastic runs with keras: keras3",
            clip="Horovod's tf-keras DistributedOptimizer reduces inside apply_gradients, after Keras clips",
            precisions=("fp32", "bf16"), why_not_precision=FP16_TORCH_ONLY,
            models_refused={m: "the legacy tf-keras path builds the MLP only; the ResNets and the language "
                               "model run with keras: keras3" for m in ("resnet18", "resnet50", "transformer_lm")},
            sync_batchnorm="tf-keras's BatchNormalization is not synchronized here; use keras: keras3")}),
    "mxnet": AdapterSpec("mxnet",
                         {"horovod": Implementation("toolkit.adapters.mxnet.session:MxnetSession",
                                                    "toolkit.adapters.mxnet.strategies.horovod:MxnetHorovod",
                                                    ops=("average", "sum"),
                                                    why_not="Horovod's MXNet DistributedTrainer has no Adasum",
                                                    why_not_elastic="Horovod 0.28.1 has no horovod.mxnet.elastic",
                                                    precisions=("fp32", "bf16"),
                                                    sync_batchnorm="Horovod has no MXNet SyncBatchNorm and Gluon's "
                                                                   "syncs the devices of one process only",
                                                    why_not_precision=FP16_TORCH_ONLY,
                                                    models_refused={"transformer_lm": "Gluon 1.9 has no causal "
                                                                    "self-attention layer nor a language model in "
                                                                    "its model zoo"})}),
}


def names() -> list[str]:
    return list(_ADAPTERS)


def spec(name: str) -> AdapterSpec:
    try:
        return _ADAPTERS[name]
    except KeyError:
        raise ToolkitError(f"framework={name!r} not found. Available: {', '.join(_ADAPTERS)}") from None


def is_available(name: str) -> bool:
    return importlib.util.find_spec(spec(name).package) is not None


def _import(target: str):
    module_name, _, cls = target.partition(":")
    return getattr(importlib.import_module(module_name), cls)


def load(name: str, backend: str = "horovod", keras: str = "keras3"):
    """(session class, strategy class) for framework `name` on `backend`; a clear error if the
    framework is missing."""
    s = spec(name)
    if not is_available(name):
        from toolkit.install import pins, support
        raise ToolkitError(f"framework={name!r} is not installed in this Python; install it: "
                           f"{support.install_fix(*pins.framework_requirements(name))}")
    implementation = s.implementation(backend, keras)
    return _import(implementation.session), _import(implementation.strategy)


# The framework's own data modules, adapters/<framework>/<name>.py under the same names in every framework:
# `images` reads an image folder as toolkit/data/ondisk.py listed it; `shards` writes and reads sharded streams.
READERS = ("images", "shards")


def reader(name: str, kind: str):
    """Framework `name`'s data module `kind` (one of READERS), imported only when asked."""
    if kind not in READERS:
        raise ValueError(f"registry.reader({name!r}, {kind!r}): kind is one of {', '.join(READERS)}")
    return framework_module(name, kind)


# The framework's own modules beside the readers, adapters/<framework>/<name>.py in every framework: `export`
# writes a checkpoint's model in the framework's own format (`toolkit export`); `profile` starts and stops the
# framework's profiler for a window of steps (toolkit/run/profile.py).
MODULES = (*READERS, "export", "profile")


def framework_module(name: str, kind: str):
    """Framework `name`'s module `kind` (one of MODULES), imported only when asked."""
    if kind not in MODULES:
        raise ValueError(f"registry.framework_module({name!r}, {kind!r}): kind is one of {', '.join(MODULES)}")
    spec(name)
    return importlib.import_module(f"toolkit.adapters.{name}.{kind}")
