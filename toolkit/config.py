"""One frozen, validated `Config` for every framework.

Sources, lowest to highest: defaults < YAML file (`--config`) < `TOOLKIT_*` environment < CLI flags.
Only what a source really sets is merged. Every field is also a flag (`accumulation_steps` ->
`--accumulation-steps`) and an environment variable (`TOOLKIT_ACCUMULATION_STEPS`).
Bad input raises `ToolkitError` with one line naming the key, where it came from, and the fix.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from toolkit import registry
from toolkit.errors import ToolkitError

ENV_PREFIX = "TOOLKIT_"
# TOOLKIT_* variables that are not config fields (read by other parts of the toolkit).
ELASTIC_KEYS = ("min_np", "max_np", "discovery", "commit_every")
# YAML groups: `elastic: {min_np: 2}` is the key elastic_min_np.
GROUPS = {"elastic": ELASTIC_KEYS}
ENV_RESERVED = frozenset({"TOOLKIT_CACHE_DIR", "TOOLKIT_REQUIRE_GPU", "TOOLKIT_REQUIRE_MULTIHOST"})


class Backend(str, enum.Enum):
    HOROVOD = "horovod"
    NATIVE = "native"       # the framework's own strategy (TensorFlow)


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
# Datasets read from disk by each framework's own readers (toolkit/ondisk.py): `KIND:PATH`.
ON_DISK = ("imagefolder", "cifar10", "text")


class Optimizer(str, enum.Enum):
    SGD = "sgd"
    ADAM = "adam"


class LrScaling(str, enum.Enum):
    NONE = "none"
    LINEAR = "linear"       # lr * world_size (Goyal et al.)
    SQRT = "sqrt"           # lr * sqrt(world_size)


class Compression(str, enum.Enum):
    NONE = "none"
    FP16 = "fp16"           # Horovod's own, inside its allreduce
    BF16 = "bf16"           # the rest are the toolkit's (toolkit/compression.py)
    INT8 = "int8"
    TOPK = "topk"
    POWERSGD = "powersgd"


TOOLKIT_COMPRESSIONS = (Compression.BF16, Compression.INT8, Compression.TOPK, Compression.POWERSGD)


class Sync(str, enum.Enum):
    EVERY_STEP = "every_step"   # gradients exchanged every optimizer step
    LOCAL_SGD = "local_sgd"     # local_steps local steps, then the models are averaged
    ASYNC_PS = "async_ps"       # parameter server (toolkit/ps.py), workers never wait for each other
    SSP = "ssp"                 # parameter server, no worker more than `staleness` steps ahead


PS_SYNCS = (Sync.ASYNC_PS, Sync.SSP)


class Keras(str, enum.Enum):
    KERAS3 = "keras3"       # Keras 3, TensorFlow's default since 2.16
    TF_KERAS = "tf_keras"   # legacy Keras 2 (the tf-keras package), through horovod.tensorflow.keras


class Strategy(str, enum.Enum):
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


def _f(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Config:
    framework: str = _f("torch", "framework adapter", choices=registry.names)
    backend: Backend = _f(Backend.HOROVOD, "how gradients are communicated")
    keras: Keras = _f(Keras.KERAS3, "tensorflow: Keras 3, or legacy tf-keras (TF_USE_LEGACY_KERAS=1 selects it)")
    strategy: Optional[Strategy] = _f(None, "backend native: TensorFlow strategy; unset = multi_worker_mirrored "
                                            "when TF_CONFIG is set, else mirrored")
    num_devices: Optional[int] = _f(None, "strategy mirrored: devices in the one process; unset = every GPU, "
                                          "else 1 CPU (N > 1 on CPU: N logical devices)")
    model: str = _f(Model.MLP.value, "mlp, linear, resnet18, resnet50 or transformer_lm (built in), or your "
                                     "own: `pkg.module:build` (a module on PYTHONPATH or a .py file before the "
                                     "colon; build(config) returns the "
                                     "framework's model; an optional `loss(outputs, labels)` beside it replaces "
                                     "cross-entropy)")
    hidden_size: int = _f(64, "width of each hidden layer (mlp); the model width (transformer_lm)")
    hidden_layers: int = _f(1, "number of hidden layers (mlp); of transformer blocks (transformer_lm)")
    heads: int = _f(4, "transformer_lm: attention heads (hidden_size must be a multiple)")
    context: int = _f(64, "transformer_lm and text:PATH: tokens per sample (the attention window)")
    dataset: str = _f(Dataset.DIGITS.value, "digits or synthetic (built in, no download); imagefolder:PATH, "
                                           "cifar10:PATH or text:PATH (on disk, read by the framework's own "
                                           "readers); or your own: `pkg.module:load` (load(config) returns "
                                           "(train, eval): numpy (x, y) arrays or the framework's datasets)")
    image_size: Optional[int] = _f(None, "imagefolder and synthetic images: the side images are resized to; "
                                         "unset = 224 (ImageNet's); cifar10 is 32")
    augment: bool = _f(True, "imagefolder: random crop (padded by 1/8 of the side) and horizontal flip of the "
                             "training images")
    epochs: int = _f(10, "passes over the training set")
    batch_size: int = _f(32, "samples per micro-batch on each worker")
    optimizer: Optimizer = _f(Optimizer.SGD, "optimizer")
    lr: float = _f(0.05, "base learning rate (before lr_scaling)")
    momentum: float = _f(0.9, "SGD momentum")
    weight_decay: float = _f(0.0, "L2 weight decay")
    lr_scaling: LrScaling = _f(LrScaling.NONE, "scale lr by world size")
    warmup_epochs: float = _f(0.0, "linear warm-up of the learning rate, in epochs")
    compression: Compression = _f(Compression.NONE, "gradient compression on the wire: fp16 is Horovod's; "
                                                    "bf16, int8, topk and powersgd are the toolkit's")
    topk_ratio: Optional[float] = _f(None, "compression topk: fraction of gradient values sent, in (0, 1]; "
                                           "unset = 0.01")
    dgc: bool = _f(False, "compression topk: Deep Gradient Compression (momentum correction and masking: the SGD "
                          "momentum moves into the exchange; local clipping at clip_grad_norm/sqrt(N); density "
                          "warm-up from 0.25 of the values)")
    dgc_warmup_epochs: Optional[int] = _f(None, "dgc: epochs over which the density falls from 0.25 to topk_ratio; "
                                                "unset = 4 (the paper's), 0 = none")
    dgc_masking: bool = _f(True, "dgc: momentum factor masking (zero the momentum where a value was sent, as the "
                                 "paper does); false keeps it (both measured in docs/COMMUNICATION.md)")
    powersgd_rank: Optional[int] = _f(None, "compression powersgd: rank r of each gradient matrix's approximation "
                                            "(P n x r, Q m x r); unset = 1 (torch's hook's default)")
    powersgd_warmup_steps: int = _f(0, "compression powersgd: first optimizer steps allreduced uncompressed "
                                       "(torch's start_powerSGD_iter; 0 = compress from the start, as the paper)")
    error_feedback: Optional[bool] = _f(None, "compression bf16/int8/topk/powersgd: add what was not sent to the "
                                              "next step's gradient; unset = true")
    sync: Sync = _f(Sync.EVERY_STEP, "every_step (gradients averaged every step), local_sgd (local_steps local "
                                     "steps, then the models averaged), or a parameter server: async_ps (no "
                                     "waiting) or ssp (no worker more than `staleness` steps ahead)")
    local_steps: Optional[int] = _f(None, "sync local_sgd: optimizer steps between model averages (H); unset = 4")
    sync_warmup_steps: int = _f(0, "sync local_sgd: first steps fully synchronous (post-local SGD)")
    staleness: Optional[int] = _f(None, "sync ssp: the most steps a worker may run ahead of the slowest; unset = 4")
    ps_servers: Optional[int] = _f(None, "sync async_ps/ssp: parameter-server ranks (the first ones; parameters "
                                         "sharded across them); unset = 1")
    staleness_lr_damping: bool = _f(False, "sync async_ps/ssp: divide the lr of a gradient computed on "
                                           "parameters k updates old by k + 1")
    accumulation_steps: int = _f(1, "micro-batches per optimizer step (backward_passes_per_step)")
    op: Op = _f(Op.AVERAGE, "gradient reduction")
    precision: Precision = _f(Precision.FP32, "the forward pass's arithmetic: fp32, bf16 (torch autocast, Keras's "
                                              "mixed_bfloat16 policy, MXNet's AMP) or fp16 (torch autocast, Keras's "
                                              "mixed_float16; dynamic loss scaling); weights and the optimizer "
                                              "stay fp32")
    sync_batchnorm: bool = _f(False, "BatchNorm layers normalise with the statistics of every rank's batch "
                                     "(torch: the toolkit's SyncBatchNorm on Horovod; Keras 3: its "
                                     "BatchNormalization with moments allreduced, or synchronized=True under a "
                                     "strategy)")
    clip_grad_norm: Optional[float] = _f(None, "clip the reduced gradient (after the allreduce, over the whole "
                                               "accumulated step) to this global L2 norm; unset = no clipping")
    nan_guard: bool = _f(True, "stop every rank with one line when a step's reduced gradient norm (or its loss) "
                               "is NaN or infinite, before anything is saved; costs one host read per step")
    seed: int = _f(42, "base seed; rank r seeds its initial weights with seed + r")
    checkpoint_dir: Optional[str] = _f(None, "rank 0 writes checkpoints and config.yaml here")
    keep_checkpoints: int = _f(3, "how many checkpoints to keep")
    resume: bool = _f(False, "continue from the latest checkpoint in checkpoint_dir")
    preemption_check_every: int = _f(10, "steps between the ranks' checks for SIGTERM (one small allreduce: "
                                         "~3-5 ms over Gloo here); on SIGTERM every rank stops at the next "
                                         "check, rank 0 checkpoints, exit 75")
    log_dir: Optional[str] = _f(None, "rank 0 writes metrics.jsonl and TensorBoard event files here")
    wandb_project: Optional[str] = _f(None, "rank 0 also logs the metrics to this Weights & Biases project "
                                            "(needs `pip install wandb`; unset = off)")
    fusion_threshold_mb: Optional[float] = _f(None, "Horovod tensor fusion buffer (MiB; 0 = no fusion); "
                                                    "unset = Horovod's (128)")
    cycle_time_ms: Optional[float] = _f(None, "Horovod cycle time (ms); unset = Horovod's")
    timeline_file: Optional[str] = _f(None, "Horovod timeline file (JSON for chrome://tracing or Perfetto), "
                                       "written by rank 0 (HOROVOD_TIMELINE)")
    stall_check_seconds: Optional[float] = _f(None, "Horovod warns when a rank waits this long for the others; "
                                                    "0 turns the check off; unset = Horovod's (60)")
    elastic_min_np: Optional[int] = _f(None, "elastic training (Horovod elastic, gloo): the fewest workers the job "
                                             "goes on with; setting any elastic_* key turns elastic on "
                                             "(YAML: `elastic: {min_np: 1, max_np: 4, discovery: ./hosts.sh}`)")
    elastic_max_np: Optional[int] = _f(None, "elastic: the most workers; unset = no limit")
    elastic_discovery: Optional[str] = _f(None, "elastic: executable that prints the available `host:slots`, one a "
                                                "line (horovodrun --host-discovery-script)")
    elastic_commit_every: Optional[int] = _f(None, "elastic: steps between in-memory commits of the training "
                                                   "state (what a failure rolls back to); unset = 10")
    uneven_data: Optional[str] = _f(None, "give ranks different amounts of data, for tests and benchmarks: "
                                          "`RANK:FRACTION[,...]` trains that rank on FRACTION of its batches "
                                          "each epoch; it then joins (hvd.join) while the others finish")
    straggler: Optional[str] = _f(None, "slow ranks down on purpose, for tests and benchmarks: `RANK:MS[,RANK:MS]` "
                                        "sleeps MS milliseconds before each of that rank's steps")
    allow_cpu: bool = _f(False, "train on the CPU when this host has fewer GPUs than ranks (else a one-line "
                                "error naming the counts)")
    loader_workers: int = _f(0, "torch Dataset loaders: DataLoader worker processes per rank (0: read in the "
                                "training process)")
    quiet: bool = _f(False, "no progress bar and no per-epoch lines on stderr (the JSON summary still prints)")
    framework_logs: bool = _f(False, "show TensorFlow's C++ start-up logs (absl INFO lines: oneDNN, CPU features, "
                                     "gRPC), which are kept off stderr by default")

    def quiet_framework_logs(self) -> None:
        """Before the framework is imported: TensorFlow's C++ INFO lines off stderr (toolkit/quiet.py)."""
        if self.framework == "tensorflow" and not self.framework_logs:
            from toolkit import quiet
            quiet.filter_stderr()

    def __post_init__(self):
        positive_ints = ("epochs", "batch_size", "accumulation_steps", "hidden_size",
                         "hidden_layers", "keep_checkpoints", "heads", "preemption_check_every")
        for name, enum_kind, verb in (("model", Model, "build"), ("dataset", Dataset, "load")):
            value = getattr(self, name)
            if name == "dataset" and on_disk(value):
                continue
            if value not in {m.value for m in enum_kind} and not is_reference(value):
                raise ToolkitError(f"{name}={value!r}: not one of the built-in {name}s "
                                   f"({', '.join(m.value for m in enum_kind)}) nor a reference to your own "
                                   f"`pkg.module:{verb}` (a module on PYTHONPATH or a .py file before the colon)")
        self._check_workload()
        if self.loader_workers < 0:
            _bad("loader_workers", self.loader_workers, "must be >= 0", example="2")
        for name in positive_ints:
            if getattr(self, name) < 1:
                _bad(name, getattr(self, name), "must be a positive integer", example=_example(name))
        if not self.lr > 0:
            _bad("lr", self.lr, "must be > 0", example="0.05")
        if not 0 <= self.momentum < 1:
            _bad("momentum", self.momentum, "must be in [0, 1)", example="0.9")
        for name in ("weight_decay", "warmup_epochs"):
            if getattr(self, name) < 0:
                _bad(name, getattr(self, name), "must be >= 0", example="0")
        if self.fusion_threshold_mb is not None and self.fusion_threshold_mb < 0:
            _bad("fusion_threshold_mb", self.fusion_threshold_mb, "must be >= 0 (0 turns fusion off), or unset "
                 "for Horovod's default", example="64")
        if self.cycle_time_ms is not None and not self.cycle_time_ms > 0:
            _bad("cycle_time_ms", self.cycle_time_ms, "must be > 0, or unset for Horovod's default", example="5")
        self._check_communication()
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            _bad("clip_grad_norm", self.clip_grad_norm, "must be > 0 (the largest global gradient norm), or unset "
                 "for no clipping", example="1.0")
        if self.stall_check_seconds is not None and self.stall_check_seconds < 0:
            _bad("stall_check_seconds", self.stall_check_seconds, "must be >= 0 (0 turns the check off)",
                 example="120")
        if self.backend is Backend.NATIVE:
            for name in ("timeline_file", "stall_check_seconds", "fusion_threshold_mb", "cycle_time_ms"):
                if getattr(self, name) is not None:
                    raise ToolkitError(f"{name} is a Horovod setting and backend=native does not use Horovod; "
                                       f"drop {name} or use --backend horovod")
        if self.resume and not self.checkpoint_dir:
            raise ToolkitError("resume=true needs checkpoint_dir: pass --checkpoint-dir DIR "
                               "(the folder an earlier run wrote checkpoints to)")
        self._check_elastic()
        self.straggler_delays()     # validates the spec
        self.data_fractions()
        self._check_capabilities()

    @property
    def elastic(self) -> bool:
        return any(getattr(self, f"elastic_{k}") is not None for k in ELASTIC_KEYS)

    def _check_elastic(self) -> None:
        if not self.elastic:
            return
        for name in ("elastic_min_np", "elastic_max_np", "elastic_commit_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                _bad(name, getattr(self, name), "must be a positive integer", example="2")
        if (self.elastic_min_np and self.elastic_max_np) and self.elastic_max_np < self.elastic_min_np:
            raise ToolkitError(f"elastic_max_np={self.elastic_max_np} is below elastic_min_np={self.elastic_min_np}; "
                               "raise max_np or lower min_np")
        if self.backend is not Backend.HOROVOD:
            raise ToolkitError("elastic training is Horovod elastic; with backend=native drop the elastic keys")
        if self.toolkit_exchange:
            raise ToolkitError(f"elastic training runs Horovod's distributed optimizer; compression="
                               f"{self.compression.value!r} / sync={self.sync.value!r} are the toolkit's exchange, "
                               "which keeps per-rank state: use compression none or fp16 and sync every_step")
        if self.elastic_commit_every is None:
            object.__setattr__(self, "elastic_commit_every", 10)

    def data_fractions(self) -> dict[int, float]:
        """{rank: fraction of its batches it trains on} from `uneven_data`."""
        fractions = _rank_values(self.uneven_data, lambda v: 0 <= v <= 1, f"uneven_data={self.uneven_data!r}: "
                                 "expected RANK:FRACTION[,RANK:FRACTION] with RANK >= 0 and FRACTION in [0, 1], "
                                 "e.g. --uneven-data 1:0.5")
        if fractions and self.sync not in PS_SYNCS:
            if self.toolkit_exchange or self.elastic:
                raise ToolkitError("uneven_data under sync every_step needs Horovod's join in its distributed "
                                   "optimizer: drop compression bf16/int8/topk/powersgd, local_sgd and elastic, or use sync ssp")
        return fractions

    def straggler_delays(self) -> dict[int, float]:
        """{rank: seconds to sleep before each step} from `straggler`."""
        ms = _rank_values(self.straggler, lambda v: v >= 0, f"straggler={self.straggler!r}: expected RANK:MS[,RANK:MS] "
                          "with RANK >= 0 and MS >= 0 milliseconds, e.g. --straggler 1:50")
        return {rank: value / 1000 for rank, value in ms.items()}

    def _check_dgc_powersgd(self) -> None:
        if self.powersgd_rank is not None:
            if self.compression is not Compression.POWERSGD:
                raise ToolkitError(f"powersgd_rank applies to compression: powersgd (got compression="
                                   f"{self.compression.value!r}); add --compression powersgd or drop powersgd_rank")
            if self.powersgd_rank < 1:
                _bad("powersgd_rank", self.powersgd_rank, "must be a positive integer", example="2")
        if not self.dgc_masking and not self.dgc:
            raise ToolkitError("dgc_masking applies with dgc: true; add --dgc or drop dgc_masking")
        if self.powersgd_warmup_steps and self.compression is not Compression.POWERSGD:
            raise ToolkitError("powersgd_warmup_steps applies to compression: powersgd; add --compression powersgd "
                               "or drop powersgd_warmup_steps")
        if self.powersgd_warmup_steps < 0:
            _bad("powersgd_warmup_steps", self.powersgd_warmup_steps, "must be >= 0", example="1000")
        if self.dgc_warmup_epochs is not None and not self.dgc:
            raise ToolkitError("dgc_warmup_epochs applies with dgc: true; add --dgc or drop dgc_warmup_epochs")
        if self.dgc_warmup_epochs is not None and self.dgc_warmup_epochs < 0:
            _bad("dgc_warmup_epochs", self.dgc_warmup_epochs, "must be >= 0", example="4")
        if not self.dgc:
            return
        if self.compression is not Compression.TOPK:
            raise ToolkitError(f"dgc applies to compression: topk (got compression={self.compression.value!r}); "
                               "add --compression topk or drop dgc")
        if self.optimizer is not Optimizer.SGD:
            raise ToolkitError(f"dgc corrects SGD's momentum (got optimizer={self.optimizer.value!r}); "
                               "use optimizer: sgd or drop dgc")
        if self.error_feedback is False:
            raise ToolkitError("dgc accumulates what was not sent (its error feedback); drop error_feedback: false")
        if self.sync is not Sync.EVERY_STEP:
            raise ToolkitError(f"dgc runs with sync: every_step (got sync={self.sync.value!r}); drop dgc or the sync")

    @property
    def optimizer_momentum(self) -> float:
        """The momentum the built-in SGD runs with: none under dgc, whose exchange applies it."""
        return 0.0 if self.dgc else self.momentum

    def _check_communication(self) -> None:
        """The communication keys, alone and together; their defaults are filled in here."""
        toolkit_compression = self.compression in TOOLKIT_COMPRESSIONS
        if self.topk_ratio is not None:
            if self.compression is not Compression.TOPK:
                raise ToolkitError(f"topk_ratio applies to compression: topk (got compression="
                                   f"{self.compression.value!r}); add --compression topk or drop topk_ratio")
            if not 0 < self.topk_ratio <= 1:
                _bad("topk_ratio", self.topk_ratio, "must be in (0, 1] (the fraction of values sent)",
                     example="0.01")
        if self.error_feedback and not toolkit_compression:
            raise ToolkitError(f"error_feedback applies to compression bf16, int8, topk or powersgd (got compression="
                               f"{self.compression.value!r}, which loses nothing to feed back); drop it")
        self._check_dgc_powersgd()
        if self.sync is Sync.LOCAL_SGD:
            if self.local_steps is not None and self.local_steps < 1:
                _bad("local_steps", self.local_steps, "must be a positive integer (steps between averages)",
                     example="4")
            if self.compression is Compression.FP16:
                raise ToolkitError("compression=fp16 is Horovod's allreduce option and local_sgd does not "
                                   "use it; with sync: local_sgd use compression bf16, int8, topk or none")
            if self.op is not Op.AVERAGE:
                raise ToolkitError(f"op={self.op.value!r} with sync: local_sgd: local SGD averages the "
                                   "models; use op: average")
        else:
            for name in ("local_steps", "sync_warmup_steps"):
                if getattr(self, name):
                    raise ToolkitError(f"{name} applies to sync: local_sgd; add --sync local_sgd or drop {name}")
        self._check_parameter_server()
        if self.sync_warmup_steps < 0:
            _bad("sync_warmup_steps", self.sync_warmup_steps, "must be >= 0", example="0")
        if self.op is Op.ADASUM and toolkit_compression:
            raise ToolkitError(f"op=adasum is Horovod's allreduce and compression={self.compression.value!r} "
                               "is the toolkit's exchange; use op: average (or compression none/fp16)")
        # defaults that depend on other keys
        if self.compression is Compression.TOPK and self.topk_ratio is None:
            object.__setattr__(self, "topk_ratio", 0.01)
        if self.compression is Compression.POWERSGD and self.powersgd_rank is None:
            object.__setattr__(self, "powersgd_rank", 1)
        if self.dgc and self.dgc_warmup_epochs is None:
            object.__setattr__(self, "dgc_warmup_epochs", 4)
        if toolkit_compression and self.error_feedback is None:
            object.__setattr__(self, "error_feedback", True)
        if self.sync is Sync.LOCAL_SGD and self.local_steps is None:
            object.__setattr__(self, "local_steps", 4)

    def _check_clipping(self, impl) -> None:
        """clip_grad_norm clips the reduced gradient: refused where there is none to clip."""
        where = f"framework={self.framework!r} with backend={self.backend.value!r}" + \
            (f" keras={self.keras.value!r}" if self.keras is not Keras.KERAS3 else "")
        if impl.clip:
            raise ToolkitError(f"clip_grad_norm is not available for {where} ({impl.clip}); use backend: horovod "
                               "with keras: keras3, or drop clip_grad_norm")
        if self.op is Op.ADASUM:
            raise ToolkitError("clip_grad_norm with op=adasum: Adasum combines the ranks' updates, there is no "
                               "reduced gradient to clip; use op: average, or drop clip_grad_norm")
        if self.sync in PS_SYNCS:
            raise ToolkitError(f"clip_grad_norm with sync={self.sync.value}: the server applies each worker's "
                               "gradient as it comes, there is no reduced gradient to clip; use sync every_step "
                               "or local_sgd, or drop clip_grad_norm")

    def _check_parameter_server(self) -> None:
        if self.sync not in PS_SYNCS:
            for name in ("staleness", "ps_servers"):
                if getattr(self, name) is not None:
                    raise ToolkitError(f"{name} applies to sync: ssp or async_ps (a parameter server); add "
                                       f"--sync ssp or drop {name}")
            if self.staleness_lr_damping:
                raise ToolkitError("staleness_lr_damping applies to sync: ssp or async_ps; drop it")
            return
        if self.staleness is not None:
            if self.sync is Sync.ASYNC_PS:
                raise ToolkitError("staleness bounds sync: ssp; async_ps has no bound: use --sync ssp or drop staleness")
            if self.staleness < 0:
                _bad("staleness", self.staleness, "must be >= 0 (0 = every worker in step)", example="4")
        if self.ps_servers is not None and self.ps_servers < 1:
            _bad("ps_servers", self.ps_servers, f"must be at least 1: sync={self.sync.value} needs a server rank "
                 "to hold the parameters", example="1")
        if self.compression is not Compression.NONE:
            raise ToolkitError(f"compression={self.compression.value!r} with sync={self.sync.value}: the parameter "
                               "server exchanges full float32 values; use compression: none")
        if self.op is not Op.AVERAGE:
            raise ToolkitError(f"op={self.op.value!r} with sync={self.sync.value}: the server applies each "
                               "worker's gradient as it comes; use op: average")
        if self.sync is Sync.SSP and self.staleness is None:
            object.__setattr__(self, "staleness", 4)
        if self.ps_servers is None:
            object.__setattr__(self, "ps_servers", 1)

    @property
    def toolkit_exchange(self) -> bool:
        """Whether the toolkit moves the gradients (toolkit/communication.py or, for a parameter
        server, toolkit/ps.py) instead of Horovod's optimizer."""
        return self.compression in TOOLKIT_COMPRESSIONS or self.sync in (Sync.LOCAL_SGD, *PS_SYNCS)

    def _check_capabilities(self) -> None:
        """What the chosen framework and backend implement (toolkit/registry.py), with the alternative."""
        spec = registry.spec(self.framework)
        backend = self.backend.value
        if backend not in spec.backends:
            raise ToolkitError(f"backend={backend!r} is not available for framework={self.framework!r}; "
                               f"use one of: {', '.join(spec.backends)}")
        impl = spec.implementation(backend, self.keras.value)
        for name, allowed in (("op", impl.ops), ("compression", impl.compressions), ("sync", impl.syncs)):
            value = getattr(self, name).value
            if value not in allowed:
                keras = f" keras={self.keras.value!r}" if self.keras is not Keras.KERAS3 else ""
                raise ToolkitError(f"{name}={value!r} is not available for framework={self.framework!r} with "
                                   f"backend={backend!r}{keras} ({impl.why_not}); use {name}: {' or '.join(allowed)}")
        if self.uneven_data and self.sync not in PS_SYNCS and not impl.join:
            raise ToolkitError(f"uneven_data is not available for framework={self.framework!r} with backend={backend!r}"
                               f"{' keras=' + repr(self.keras.value) if self.keras is not Keras.KERAS3 else ''} "
                               "(hvd.join is used for torch only); use framework torch, or sync ssp")
        if self.model in impl.models_refused:
            raise ToolkitError(f"model={self.model!r} is not available for framework={self.framework!r} with "
                               f"backend={backend!r} ({impl.models_refused[self.model]}); use another framework "
                               "or your own model (model: pkg.module:build)")
        if self.clip_grad_norm is not None:
            self._check_clipping(impl)
        if self.sync_batchnorm and impl.sync_batchnorm:
            raise ToolkitError(f"sync_batchnorm is not available for framework={self.framework!r} with "
                               f"backend={backend!r} ({impl.sync_batchnorm}); drop sync_batchnorm")
        if self.precision.value not in impl.precisions:
            raise ToolkitError(f"precision={self.precision.value!r} is not available for framework={self.framework!r} "
                               f"with backend={backend!r} ({impl.why_not_precision}); use precision: "
                               f"{' or '.join(impl.precisions)}")
        if self.precision is Precision.FP16 and (self.toolkit_exchange or self.sync in PS_SYNCS or self.op is Op.ADASUM):
            raise ToolkitError(f"precision=fp16 scales the loss and unscales the reduced gradient around Horovod's "
                               f"allreduce; with compression={self.compression.value!r}, sync={self.sync.value!r}, "
                               f"op={self.op.value!r} there is none: use precision bf16, or compression none/fp16, "
                               "sync every_step and op average/sum")
        if self.elastic and not impl.elastic:
            raise ToolkitError(f"elastic training is not available for framework={self.framework!r} with "
                               f"backend={backend!r} ({impl.why_not_elastic}); drop the elastic keys")
        if self.keras is not Keras.KERAS3 and self.framework != "tensorflow":
            raise ToolkitError(f"keras={self.keras.value!r} applies to framework: tensorflow only; drop it")
        if self.keras is Keras.TF_KERAS and self.backend is Backend.NATIVE:
            raise ToolkitError("keras='tf_keras' runs on backend: horovod (horovod.tensorflow.keras); "
                               "the native strategies run Keras 3 here: drop keras or use --backend horovod")
        if self.strategy is not None and self.backend is not Backend.NATIVE:
            raise ToolkitError(f"strategy={self.strategy.value!r} needs backend: native (with backend horovod, "
                               "Horovod does the communication); add --backend native or drop strategy")
        if self.num_devices is not None:
            if self.num_devices < 1:
                _bad("num_devices", self.num_devices, "must be a positive integer", example="2")
            if self.backend is not Backend.NATIVE or self.strategy is Strategy.MULTI_WORKER_MIRRORED:
                raise ToolkitError("num_devices applies to strategy: mirrored (one process, several devices); "
                                   "elsewhere each rank has one device: set the number of ranks with -np")

    def _check_workload(self) -> None:
        """The built-in models' own keys, and which data each one reads."""
        disk = on_disk(self.dataset)
        if disk and not disk[1]:
            raise ToolkitError(f"dataset={self.dataset!r}: no path after the colon; e.g. --dataset {disk[0]}:data/"
                               f"{'corpus.txt' if disk[0] == 'text' else 'images'}")
        if self.context < 2:
            _bad("context", self.context, "must be at least 2 (tokens per sample)", example="64")
        if self.image_size is not None and self.image_size < 32:
            _bad("image_size", self.image_size, "must be at least 32 (the ResNets downsample by 32)", example="32")
        if self.image_size is not None and disk and disk[0] == "cifar10":
            raise ToolkitError("image_size does not apply to cifar10 (its images are 32x32); drop image_size")
        if self.model == Model.TRANSFORMER_LM.value and self.hidden_size % self.heads:
            raise ToolkitError(f"hidden_size={self.hidden_size} is not a multiple of heads={self.heads} "
                               "(transformer_lm splits the width across the heads); e.g. --hidden-size 64 --heads 4")
        text = bool(disk and disk[0] == "text")
        if self.model == Model.TRANSFORMER_LM.value and not (text or self.dataset == Dataset.SYNTHETIC.value
                                                             or is_reference(self.dataset)):
            raise ToolkitError(f"model=transformer_lm reads tokens: use dataset text:PATH (a plain text file) or "
                               f"synthetic, not {self.dataset!r}")
        if text and self.model != Model.TRANSFORMER_LM.value and not is_reference(self.model):
            raise ToolkitError(f"dataset={self.dataset!r} gives token sequences: use model transformer_lm (or your "
                               f"own), not {self.model!r}")
        images = bool(disk and disk[0] != "text")
        if self.model in IMAGE_MODELS and not (images or self.dataset == Dataset.SYNTHETIC.value
                                               or is_reference(self.dataset)):
            raise ToolkitError(f"model={self.model} reads images: use dataset imagefolder:PATH, cifar10:PATH or "
                               f"synthetic, not {self.dataset!r}")
        if images and self.model in (Model.MLP.value, Model.LINEAR.value):
            raise ToolkitError(f"dataset={self.dataset!r} gives images: use model resnet18 or resnet50 (or your "
                               f"own), not {self.model!r}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_yaml(self) -> str:
        """The config as YAML in the README's form: the elastic keys as one `elastic:` block, and an
        unset key whose value depends on others (`staleness`, `topk_ratio`, ...) commented with it.
        `--config` reads it back to the same Config."""
        import re

        import yaml
        values, grouped = self.to_dict(), {}
        for name, value in values.items():
            group = next((g for g in GROUPS if name.startswith(f"{g}_") and name[len(g) + 1:] in GROUPS[g]), None)
            if group:
                grouped.setdefault(group, {})[name[len(group) + 1:]] = value
            else:
                grouped[name] = value
        unset = {f.name: m.group(1).strip() for f in dataclasses.fields(self)
                 if (m := re.search(r"unset = ((?:[^;()]|\([^)]*\))+)", f.metadata["help"]))}
        lines, group = [], None
        for line in yaml.safe_dump(grouped, sort_keys=False).splitlines():
            key = line.strip().split(":", 1)[0]
            nested = line.startswith(" ")
            name = f"{group}_{key}" if nested else key
            if not nested:
                group = key
            if line.endswith(": null") and name in unset:
                line += f"  # unset: {unset[name]}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config") -> "Config":
        kinds = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in values if k not in kinds]
        if unknown:
            key = unknown[0]
            near = difflib.get_close_matches(str(key), kinds, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ToolkitError(f"{source}: unknown key {key!r}; {hint}allowed keys: {', '.join(kinds)}")
        values = flatten_groups(values, source)
        return cls(**{k: _coerce(kinds[k], v, source) for k, v in values.items()})


def on_disk(value: str) -> tuple[str, str] | None:
    """`imagefolder:PATH`, `cifar10:PATH`, `text:PATH` -> (kind, PATH); anything else None."""
    kind, sep, path = str(value).partition(":")
    return (kind, path) if sep and kind in ON_DISK else None


def is_reference(value: str) -> bool:
    """`pkg.module:function` or `path/file.py:function`: the user's code, not a built-in name."""
    module, sep, function = str(value).rpartition(":")
    return bool(sep and module and function.isidentifier())


def _rank_values(spec: Optional[str], valid, error: str) -> dict[int, float]:
    """`RANK:VALUE[,RANK:VALUE]` -> {rank: value}; `error` (one line) when a part does not parse or
    `valid(value)` is false."""
    values = {}
    for item in filter(None, (spec or "").replace(" ", "").split(",")):
        rank, _, value = item.partition(":")
        try:
            values[int(rank)] = float(value)
        except ValueError:
            raise ToolkitError(error) from None
        if int(rank) < 0 or not valid(values[int(rank)]):
            raise ToolkitError(error)
    return values


def _plain(value):
    return value.value if isinstance(value, enum.Enum) else value


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _example(name: str) -> str:
    f = next(f for f in dataclasses.fields(Config) if f.name == name)
    kind, _ = _base_type(f)
    if f.default is None and isinstance(kind, type) and issubclass(kind, enum.Enum):
        return next(iter(kind)).value
    return str(_plain(f.default))


def _bad(name: str, value, why: str, example: str) -> None:
    raise ToolkitError(f"{name}={value!r} {why}; e.g. {flag(name)} {example} or `{name}: {example}` in YAML")


def _base_type(f: dataclasses.Field):
    hint = typing.get_type_hints(Config)[f.name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _coerce(f: dataclasses.Field, raw, source: str):
    """Turn a YAML, environment or CLI value into the field's type, or say what was expected."""
    kind, optional = _base_type(f)
    where = f" (from {source})"
    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "null"))):
        return None
    text = raw.strip() if isinstance(raw, str) else raw
    try:
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return kind(str(text).lower())
        if "choices" in f.metadata:
            choices = f.metadata["choices"]()
            if str(text) not in choices:
                raise ToolkitError(f"{f.name}={raw!r}{where} not found. Available: {', '.join(choices)}")
            return str(text)
        if kind is bool:
            if isinstance(text, bool):
                return text
            if str(text).lower() in _TRUE | _FALSE:
                return str(text).lower() in _TRUE
            raise ValueError
        if kind is int:
            if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
                raise ValueError
            return int(text)
        if kind is float:
            if isinstance(text, bool):
                raise ValueError
            return float(text)
        if kind is str:
            if not isinstance(text, (str, int, float)) or isinstance(text, bool):
                raise ValueError
            return str(text)
    except (ValueError, TypeError):
        pass
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind)
    if expected is None:
        expected = "one of: " + ", ".join(m.value for m in kind)
    raise ToolkitError(f"{f.name}={raw!r}{where} must be {expected}; e.g. {flag(f.name)} {_example(f.name)}")


# ---- sources ----------------------------------------------------------------------------------

def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ToolkitError(f"--config {path}: file not found; check the path")
    text = p.read_text()
    if not text.strip():
        raise ToolkitError(f"--config {path}: the file is empty; write at least one key, e.g. `epochs: 5`")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ToolkitError(f"--config {path}: invalid YAML{at}: {problem}") from None
    if data is None:
        raise ToolkitError(f"--config {path}: no keys (only comments?); write at least one, e.g. `epochs: 5`")
    if not isinstance(data, dict):
        raise ToolkitError(f"--config {path}: expected `key: value` lines at the top level, "
                           f"got a {type(data).__name__}")
    return flatten_groups(data, f"--config {path}")


def flatten_groups(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`elastic: {min_np: 2}` -> `elastic_min_np: 2` (a YAML group is its keys with a prefix)."""
    out = {}
    for key, value in data.items():
        if key not in GROUPS:
            out[key] = value
            continue
        if not isinstance(value, dict):
            raise ToolkitError(f"{source}: `{key}` is a group of keys ({', '.join(GROUPS[key])}); write e.g. "
                               f"`{key}: {{{GROUPS[key][0]}: 2}}`")
        for sub, v in value.items():
            if sub not in GROUPS[key]:
                near = difflib.get_close_matches(str(sub), GROUPS[key], n=1)
                hint = f"did you mean {near[0]!r}? " if near else ""
                raise ToolkitError(f"{source}: unknown key {key}.{sub}; {hint}allowed: {', '.join(GROUPS[key])}")
            out[f"{key}_{sub}"] = v
    return out


def read_env(environ: Mapping[str, str]) -> dict[str, str]:
    names = {f.name for f in dataclasses.fields(Config)}
    values = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or key in ENV_RESERVED:
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {ENV_PREFIX}{near[0].upper()}? " if near else ""
            raise ToolkitError(f"environment: unknown variable {key}; {hint}unset it or use one of "
                               f"{ENV_PREFIX}<FIELD> for the fields in `toolkit config show`")
        values[name] = value
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config` plus one flag per field. Defaults are SUPPRESSed so only what the user set exists."""
    parser.add_argument("--config", metavar="FILE.yaml", default=argparse.SUPPRESS,
                        help="YAML file of config keys (below flags and TOOLKIT_* in precedence)")
    group = parser.add_argument_group("config (also YAML keys and TOOLKIT_<KEY> variables)")
    for f in dataclasses.fields(Config):
        kind, _ = _base_type(f)
        help_text = f.metadata["help"] + f" (default: {_plain(f.default)})"
        if kind is bool:
            group.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
            continue
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            help_text += " {" + ",".join(m.value for m in kind) + "}"
        elif "choices" in f.metadata:
            help_text += " {" + ",".join(f.metadata["choices"]()) + "}"
        group.add_argument(flag(f.name), dest=f.name, metavar=f.name.upper(), default=argparse.SUPPRESS,
                           help=help_text)


def load(source: "str | os.PathLike | Mapping[str, Any] | Config | None" = None, **keys) -> Config:
    """The config of `toolkit.start(...)`: a YAML file's path, a dict of keys, a Config, or nothing;
    then TOOLKIT_* variables; then `keys` (keyword arguments win, as flags do on the command line)."""
    if isinstance(source, Config):
        return dataclasses.replace(source, **{k: _coerce(_field(k, "start()"), v, "start()") for k, v in keys.items()})
    if source is None or isinstance(source, Mapping):
        return resolve(keys, base=dict(source or {}))
    return resolve({"config": str(source), **keys})


def _field(name: str, source: str) -> dataclasses.Field:
    kinds = {f.name: f for f in dataclasses.fields(Config)}
    if name not in kinds:
        Config.from_dict({name: None}, source=source)      # words the error (nearest key, allowed keys)
    return kinds[name]


def resolve(args: argparse.Namespace | Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None, base: Mapping[str, Any] | None = None) -> Config:
    """defaults < `base` (a dict of keys) < YAML (`config` in args) < TOOLKIT_* environment < CLI values in `args`."""
    cli = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    names = {f.name for f in dataclasses.fields(Config)}
    path = cli.pop("config", None)
    merged: dict[str, tuple[Any, str]] = {}
    if base:
        merged.update({k: (v, "start()") for k, v in flatten_groups(base, "start()").items()})
    if path is not None:
        merged.update({k: (v, path) for k, v in read_yaml(path).items()})
    environ = os.environ if environ is None else environ
    merged.update({k: (v, f"{ENV_PREFIX}{k.upper()}") for k, v in read_env(environ).items()})
    merged.update({k: (v, flag(k)) for k, v in cli.items() if k in names})
    kinds = {f.name: f for f in dataclasses.fields(Config)}
    unknown = [k for k in merged if k not in kinds]
    if unknown:
        # from_dict words the message (nearest key, allowed keys)
        Config.from_dict({unknown[0]: None}, source=merged[unknown[0]][1])
    values = {k: _coerce(kinds[k], v, src) for k, (v, src) in merged.items()}
    if ("keras" not in values and values.get("framework") == "tensorflow"
            and values.get("backend", Backend.HOROVOD) is Backend.HOROVOD
            and str(environ.get("TF_USE_LEGACY_KERAS", "")).lower() in _TRUE):
        values["keras"] = Keras.TF_KERAS     # TensorFlow's own switch for legacy Keras, honoured
    return Config(**values)
