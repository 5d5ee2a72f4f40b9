"""The str-valued enums of the config's fixed choices, and the named sets of them other modules test against."""
from __future__ import annotations

import enum

from toolkit import registry


class Backend(str, enum.Enum):
    HOROVOD = "horovod"
    NATIVE = "native"       # the framework's own engine: TensorFlow's strategies, torch.distributed (DDP, FSDP2)
    DATAPARALLEL = "dataparallel"   # torch.nn.DataParallel: named only to be refused with the reason (config/rules.py)


class Sharding(str, enum.Enum):
    NONE = "none"           # every rank holds the whole model, its gradients and optimizer state
    ZERO1 = "zero1"         # optimizer state sharded across the ranks (torch's ZeroRedundancyOptimizer)
    FSDP = "fsdp"           # parameters, gradients and optimizer state sharded (FSDP2 fully_shard per block)


class CheckpointFormat(str, enum.Enum):
    SINGLE = "single"       # the toolkit's own files, written by rank 0 (state.pt, model.keras, model.params)
    SHARDED = "sharded"     # torch: every rank writes its shards through torch.distributed.checkpoint


class Dataset(str, enum.Enum):
    DIGITS = "digits"       # the real 8x8 handwritten digits that scikit-learn ships
    SYNTHETIC = "synthetic"


class Model(str, enum.Enum):
    MLP = "mlp"
    LINEAR = "linear"
    RESNET18 = "resnet18"               # the frameworks' model zoos (Keras: built from its layers)
    RESNET50 = "resnet50"
    TRANSFORMER_LM = "transformer_lm"   # a small decoder-only language model (causal self-attention)


IMAGE_MODELS = (Model.RESNET18.value, Model.RESNET50.value)
# Datasets read from disk by each framework's own readers (toolkit/data/ondisk.py): `KIND:PATH`.
ON_DISK = ("imagefolder", "cifar10", "text", "shards")


class Optimizer(str, enum.Enum):
    SGD = "sgd"
    ADAM = "adam"


class LrScaling(str, enum.Enum):
    NONE = "none"
    LINEAR = "linear"       # lr * world_size (Goyal et al.)
    SQRT = "sqrt"           # lr * sqrt(world_size)


class LrSchedule(str, enum.Enum):
    CONSTANT = "constant"   # the scaled lr after the warm-up
    COSINE = "cosine"       # half a cosine from the scaled lr to 0 over the steps after the warm-up
    STEP = "step"           # x lr_step_gamma every lr_step_epochs (torch's StepLR)


class Compression(str, enum.Enum):
    NONE = "none"
    FP16 = "fp16"           # Horovod's own, inside its allreduce
    BF16 = "bf16"           # the rest are the toolkit's (toolkit/exchange/compression.py)
    INT8 = "int8"
    TOPK = "topk"
    POWERSGD = "powersgd"
    AUTO = "auto"           # chosen at the first setup() from a probe of the links (toolkit/planner/auto.py)


# Which compressions Horovod runs and which the toolkit's exchange runs: said once, in the registry.
TOOLKIT_COMPRESSIONS = tuple(Compression(name) for name in registry.TOOLKIT_COMPRESSIONS)


class Sync(str, enum.Enum):
    EVERY_STEP = "every_step"   # gradients exchanged every optimizer step
    LOCAL_SGD = "local_sgd"     # local_steps local steps, then the models are averaged
    ASYNC_PS = "async_ps"       # parameter server (toolkit/run/ps.py), workers never wait for each other
    SSP = "ssp"                 # parameter server, no worker more than `staleness` steps ahead


PS_SYNCS = (Sync.ASYNC_PS, Sync.SSP)


class Keras(str, enum.Enum):
    KERAS3 = "keras3"       # Keras 3, TensorFlow's default since 2.16
    TF_KERAS = "tf_keras"   # legacy Keras 2 (the tf-keras package), through horovod.tensorflow.keras


class TfStrategy(str, enum.Enum):
    """TensorFlow's own distribution strategy (the key `strategy`, backend native); not adapters/strategy.py's
    Strategy, which is how any backend moves the gradients."""
    MIRRORED = "mirrored"                           # one process, several devices
    MULTI_WORKER_MIRRORED = "multi_worker_mirrored"  # one process per worker, TF_CONFIG


class Precision(str, enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"           # autocast / a mixed policy; no loss scaling needed
    FP16 = "fp16"           # autocast with dynamic loss scaling (torch's GradScaler)


class Op(str, enum.Enum):
    AVERAGE = "average"
    SUM = "sum"
    ADASUM = "adasum"
