"""The config's keys, one small frozen dataclass per group: each key is written once, with its default in the
field and its help in the field's metadata (`help`; `unset`: what None stands for in a key whose default is None,
a value that derived.py fills in, or words). `Config` (schema.py) is composed from these fields; docs/CONFIG.md,
`--help` and `config show` are generated from them.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Optional

from toolkit import registry

from .enums import (
    Backend,
    CheckpointFormat,
    Compression,
    Dataset,
    Keras,
    LrScaling,
    LrSchedule,
    Model,
    Op,
    Optimizer,
    Precision,
    Sharding,
    Sync,
    TfStrategy,
)


def _show(value) -> str:
    """A value as YAML and the flags write it (True -> true)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value.value if isinstance(value, enum.Enum) else value)


def _f(default, help: str, *, unset=None, note: str = "", **kw):
    """A key: `default`, its `help`; for a key whose default is None, `unset` is what None means (a value the
    resolve step or a reader fills in, or words), written into the help at `{unset}` (with `note` after it)."""
    meta = {"help": help, **kw}
    if unset is not None:
        meta["unset"] = unset
        meta["unset_text"] = _show(unset) + (f" {note}" if note else "")
        meta["help"] = help.replace("{unset}", meta["unset_text"])
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class LaunchConfig:
    """Which framework and backend, how the ranks run, and what they print."""
    group = "launch"
    framework: str = _f("torch", "framework adapter", choices=registry.names)
    backend: Backend = _f(Backend.HOROVOD, "how gradients are communicated: horovod, or native (the framework's own "
                                           "engine, no Horovod: torch.distributed with DDP/FSDP2, TensorFlow's "
                                           "strategies); dataparallel is refused (one process: use native)")
    sharding: Sharding = _f(Sharding.NONE, "torch backend native: none, zero1 (optimizer state sharded: torch's "
                                           "ZeroRedundancyOptimizer) or fsdp (parameters, gradients and optimizer "
                                           "state sharded: FSDP2 fully_shard per block)")
    keras: Keras = _f(Keras.KERAS3, "tensorflow: Keras 3, or legacy tf-keras (TF_USE_LEGACY_KERAS=1 selects it)")
    strategy: Optional[TfStrategy] = _f(None, "backend native: TensorFlow strategy; unset = {unset}",
                                      unset="multi_worker_mirrored when TF_CONFIG is set, else mirrored")
    num_devices: Optional[int] = _f(None, "strategy mirrored: devices in the one process; unset = {unset}",
                                    unset="every GPU, else 1 CPU (N > 1 on CPU: N logical devices)")
    log_dir: Optional[str] = _f(None, "rank 0 appends per-epoch metrics to metrics.jsonl and TensorBoard event "
                                      "files here (`tensorboard --logdir DIR`)")
    wandb_project: Optional[str] = _f(None, "rank 0 also logs the metrics to this Weights & Biases project "
                                            "(needs `pip install wandb`, the extra horovod-toolkit[wandb]; `make setup` installs the pinned "
                                            "client for the tests, which run it offline; unset = {unset})", unset="off")
    mlflow_tracking_uri: Optional[str] = _f(None, "rank 0 also logs to MLflow at this tracking URI (http://host:5000 "
                                                  "for a tracking server, sqlite:///path/mlflow.db, databricks, ...): one "
                                                  "run per job (a resumed job continues its run), the resolved config as "
                                                  "params, the per-epoch metrics with their step, summary.json at the end "
                                                  "(needs `pip install mlflow`, the extra horovod-toolkit[mlflow]); "
                                                  "unset = {unset}", unset="off")
    mlflow_experiment: Optional[str] = _f(None, "the MLflow experiment of the run (made when missing); unset = {unset}",
                                          unset="MLflow's default experiment")
    mlflow_run_name: Optional[str] = _f(None, "the MLflow run's name; unset = {unset}", unset="a name MLflow makes up")
    peak_tflops: Optional[float] = _f(None, "one device's peak, TFLOP/s, for `mfu` (the model FLOPs a device "
                                            "achieves over its peak); unset = {unset}",
                                      unset="the dense 16-bit peak of a GPU the toolkit knows by name (H100, "
                                            "H200, A100, L40S, L4, A10, V100), else no mfu")
    profile_dir: Optional[str] = _f(None, "every rank profiles the steps of profile_steps with its framework's "
                                          "profiler and writes its trace here, the rank in the name (torch, MXNet: "
                                          "trace-rank{R}.json for Chrome/Perfetto, joined by `toolkit profile merge "
                                          "DIR`; TensorFlow: rank{R}/ for TensorBoard's profile plugin); unset = {unset}",
                                    unset="no profile")
    profile_steps: str = _f("2:5", "with profile_dir: the optimizer steps profiled, START:END counted from 0 (END "
                                   "not included)")
    uneven_data: Optional[str] = _f(None, "give ranks different amounts of data, for tests and benchmarks: "
                                          "`RANK:FRACTION[,...]` trains that rank on FRACTION of its batches "
                                          "each epoch; it then joins (hvd.join) while the others finish")
    straggler: Optional[str] = _f(None, "slow ranks down on purpose, for tests and benchmarks: `RANK:MS[,RANK:MS]` "
                                        "sleeps MS milliseconds before each of that rank's steps")
    allow_cpu: bool = _f(False, "train on the CPU when this host has fewer GPUs than ranks (else a one-line "
                                "error naming the counts)")
    quiet: bool = _f(False, "no progress bar and no per-epoch lines on stderr (the JSON summary still prints; "
                            "rank 0 shows a tqdm bar only when stderr is a terminal)")
    framework_logs: bool = _f(False, "show TensorFlow's C++ start-up logs (absl INFO lines: oneDNN, CPU features, "
                                     "gRPC), which are kept off stderr by default")


@dataclass(frozen=True)
class WorkloadConfig:
    """The model, the data, the optimizer and its schedule."""
    group = "workload"
    model: str = _f(Model.MLP.value, "mlp, linear, resnet18, resnet50 (torchvision, keras.applications / Keras "
                                     "layers, Gluon's model zoo; weights=None) or transformer_lm (a decoder-only "
                                     "LM, torch and Keras 3) (built in), or your own: `pkg.module:build` (a module "
                                     "on PYTHONPATH or a .py file before the colon; build(config) returns the "
                                     "framework's model; an optional `loss(outputs, labels)` beside it replaces "
                                     "cross-entropy; batches that are not (x, y) go to the model whole (torch, "
                                     "Keras 3, MXNet), then to loss(outputs, batch) or the model's own loss)")
    hidden_size: int = _f(64, "width of each hidden layer (mlp); the model width (transformer_lm)")
    hidden_layers: int = _f(1, "number of hidden layers (mlp); of transformer blocks (transformer_lm)")
    heads: int = _f(4, "transformer_lm: attention heads (hidden_size must be a multiple)")
    context: int = _f(64, "transformer_lm and text:PATH: tokens per sample (the attention window)")
    dataset: str = _f(Dataset.DIGITS.value, "digits (scikit-learn's real 8x8 digits) or synthetic (shaped for the "
                                           "model) (built in, no download); on disk, read by the framework's own "
                                           "readers: imagefolder:PATH (PATH/<class>/*.png|jpg with 20% held out, or "
                                           "PATH/train/... + PATH/val/...), cifar10:PATH (CIFAR-10's python "
                                           "batches) or text:PATH (byte tokens, the last 10% evaluated); "
                                           "sharded streams: shards:PATH (written by `toolkit shards`: a folder, "
                                           "or a glob/brace pattern of its training shards); or your "
                                           "own: `pkg.module:load` (load(config) returns (train, eval): numpy "
                                           "(x, y) arrays or the framework's datasets)")
    image_size: Optional[int] = _f(None, "imagefolder and synthetic images: the side images are resized to; "
                                         "at least 32; unset = {unset}; cifar10 is 32", unset=224, note="(ImageNet's)")
    augment: bool = _f(True, "imagefolder: random crop (padded by 1/8 of the side) and horizontal flip of the "
                             "training images")
    epochs: int = _f(10, "passes over the training set")
    batch_size: int = _f(32, "samples per micro-batch per replica (a rank under Horovod, a device under mirrored)")
    optimizer: Optimizer = _f(Optimizer.SGD, "optimizer")
    lr: float = _f(0.05, "base learning rate (before lr_scaling)")
    momentum: float = _f(0.9, "SGD momentum")
    weight_decay: float = _f(0.0, "L2 weight decay")
    lr_scaling: LrScaling = _f(LrScaling.NONE, "scale lr by world size: none, linear (x world size) or sqrt "
                                               "(x sqrt(world size))")
    warmup_epochs: float = _f(0.0, "linear warm-up of the learning rate, in epochs: from the unscaled lr to the "
                                   "scaled one (Goyal et al.), or from ~0 to lr when not scaled")
    lr_schedule: LrSchedule = _f(LrSchedule.CONSTANT, "the lr after the warm-up, per optimizer step: constant (the "
                                                      "scaled lr), cosine (from the scaled lr down to 0 at the end "
                                                      "of the last epoch: scaled lr x (1 + cos(pi x t / T)) / 2, t "
                                                      "the steps since the warm-up, T those left in the run) or step "
                                                      "(scaled lr x lr_step_gamma every lr_step_epochs, counted from "
                                                      "the first step, as torch's StepLR)")
    lr_step_epochs: Optional[float] = _f(None, "lr_schedule step: epochs between two decays (rounded to whole "
                                               "steps); unset = {unset}", unset=30.0, note="(ResNet on ImageNet)")
    lr_step_gamma: Optional[float] = _f(None, "lr_schedule step: the factor of each decay, in (0, 1]; "
                                              "unset = {unset}", unset=0.1, note="(torch's StepLR)")
    seed: int = _f(42, "base seed; rank r seeds its initial weights with seed + r; data order depends on seed "
                       "and epoch only")
    loader_workers: int = _f(0, "torch Dataset loaders: DataLoader worker processes per rank (0: read in the "
                                "training process)")


@dataclass(frozen=True)
class CommunicationConfig:
    """How the gradients (or models) move between the ranks: reduction, compression, synchronisation."""
    group = "communication"
    compression: Compression = _f(Compression.NONE, "gradient compression on the wire: fp16 is Horovod's (inside "
                                                    "its allreduce); bf16, int8 (per block of 256 values + a "
                                                    "float32 scale), topk (indices + values, allgathered) and "
                                                    "powersgd (low-rank factors, allreduced) are the toolkit's "
                                                    "(docs/COMMUNICATION.md); auto times each one's exchange at "
                                                    "the first setup (none, fp16; on several hosts bf16 and int8, "
                                                    "flat or hierarchical) and keeps the fastest")
    topk_ratio: Optional[float] = _f(None, "compression topk: fraction of gradient values sent, in (0, 1]; "
                                           "unset = {unset}", unset=0.01)
    dgc: bool = _f(False, "compression topk: Deep Gradient Compression (momentum correction and masking: the SGD "
                          "momentum moves into the exchange; local clipping at clip_grad_norm/sqrt(N); density "
                          "warm-up from 0.25 of the values)")
    dgc_warmup_epochs: Optional[int] = _f(None, "dgc: epochs over which the density falls from 0.25 to topk_ratio; "
                                                "unset = {unset}", unset=4, note="(the paper's), 0 = none")
    dgc_masking: bool = _f(True, "dgc: momentum factor masking (zero the momentum where a value was sent, as the "
                                 "paper does); false keeps it (both measured in docs/COMMUNICATION.md)")
    powersgd_rank: Optional[int] = _f(None, "compression powersgd: rank r of each gradient matrix's approximation "
                                            "(P n x r, Q m x r; vectors and small matrices are sent whole); "
                                            "unset = {unset}", unset=1,
                                      note="(torch's hook's default)")
    powersgd_warmup_steps: int = _f(0, "compression powersgd: first optimizer steps allreduced uncompressed "
                                       "(torch's start_powerSGD_iter; 0 = compress from the start, as the paper)")
    error_feedback: Optional[bool] = _f(None, "compression bf16/int8/topk/powersgd: add what was not sent to the "
                                              "next step's gradient (kept per parameter and rank, saved in "
                                              "checkpoints); unset = {unset}", unset=True)
    hierarchical_exchange: Optional[bool] = _f(None, "the exchange in two levels: a float32 reduce-scatter among the ranks "
                                            "of a host, the compressed exchange of each rank's share across "
                                            "hosts (ranks of the same local rank only), an allgather inside the "
                                            "host; with compression none, float32 across hosts too. unset = "
                                            "{unset}", unset="auto",
                                      note="(on for compression bf16/int8 when the job has several hosts "
                                           "with several ranks each, on GPUs or backend native; Horovod on a "
                                           "CPU runs it only when true)")
    overlap: Optional[bool] = _f(None, "torch: the toolkit's exchange in buckets started as the backward pass makes "
                                       "their gradients ready, so it runs beside the rest of the backward pass "
                                       "(compression bf16/int8, flat or hierarchical, every step); unset = "
                                       "{unset}", unset="auto",
                                 note="(on a GPU where the gradient fills more than one bucket; off on the CPU, "
                                      "where compression takes the backward pass's cores)")
    bucket_mb: float = _f(25.0, "overlap: megabytes of float32 gradient values per bucket (DDP's bucket_cap_mb)")
    sync: Sync = _f(Sync.EVERY_STEP, "every_step (gradients averaged every step), local_sgd (local_steps local "
                                     "steps, then the models and optimizer slots averaged; also at each epoch's "
                                     "end), or a parameter server over mpi4py: async_ps (no waiting) or ssp (no "
                                     "worker more than `staleness` steps ahead)")
    local_steps: Optional[int] = _f(None, "sync local_sgd: optimizer steps between model averages (H); "
                                          "unset = {unset}", unset=4)
    sync_warmup_steps: int = _f(0, "sync local_sgd: first steps fully synchronous (post-local SGD)")
    accumulation_steps: int = _f(1, "micro-batches per optimizer step (backward_passes_per_step); global batch = "
                                    "batch_size x accumulation_steps x replicas")
    op: Op = _f(Op.AVERAGE, "gradient reduction: average, sum or adasum (Adasum needs Horovod's MPI controller and "
                            "2^n ranks; MXNet: average or sum)")


@dataclass(frozen=True)
class ParameterServerConfig:
    """sync async_ps / ssp: the parameter server (toolkit/run/ps.py)."""
    group = "parameter_server"
    staleness: Optional[int] = _f(None, "sync ssp: the most steps a worker may run ahead of the slowest; "
                                        "unset = {unset}", unset=4)
    ps_servers: Optional[int] = _f(None, "sync async_ps/ssp: parameter-server ranks (the first ones; parameters "
                                         "sharded across them); unset = {unset}", unset=1)
    staleness_lr_damping: bool = _f(False, "sync async_ps/ssp: divide the lr of a gradient computed on "
                                           "parameters k updates old by k + 1")


@dataclass(frozen=True)
class PrecisionConfig:
    """The arithmetic of the step and the checks on its result."""
    group = "precision"
    precision: Precision = _f(Precision.FP32, "the forward pass's arithmetic: fp32, bf16 (torch autocast, Keras's "
                                              "mixed_bfloat16 policy, MXNet's AMP) or fp16 (torch autocast, Keras's "
                                              "mixed_float16; dynamic loss scaling: an overflow skips the step on "
                                              "every rank, counted in skipped_steps); weights and the optimizer "
                                              "stay fp32; MXNet: bf16 only, on a CPU with AVX-512")
    compile: bool = _f(False, "torch: torch.compile the model in session.setup(), after the strategy wrapped it "
                              "(DDP, FSDP2), as torch recommends; checkpoints hold the plain module's state; the "
                              "first step's time and the graph breaks are printed once")
    sync_batchnorm: bool = _f(False, "BatchNorm layers normalise with the statistics of every rank's batch "
                                     "(torch: the toolkit's SyncBatchNorm on Horovod; Keras 3: its "
                                     "BatchNormalization with moments allreduced, or synchronized=True under a "
                                     "strategy; refused for MXNet and tf-keras)")
    clip_grad_norm: Optional[float] = _f(None, "clip the reduced gradient (after the allreduce, over the whole "
                                               "accumulated step) to this global L2 norm; session.grad_norm is the "
                                               "norm before clipping; unset = {unset}",
                                         unset="no clipping")
    nan_guard: bool = _f(True, "stop every rank with one line when a step's reduced gradient norm (when clipping) "
                               "or its loss averaged over the ranks is NaN or infinite, before anything is "
                               "saved (read every nan_check_every steps)")
    nan_check_every: int = _f(10, "nan_guard: optimizer steps between the guard's reads of the steps' values (one "
                                  "host read for all of them, none in between; 1 = every step); training stops at "
                                  "the first read after a non-finite step, naming it; evaluation, checkpoints and "
                                  "the replica check read first")


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints, resume and preemption."""
    group = "checkpoint"
    checkpoint_dir: Optional[str] = _f(None, "rank 0 writes ckpt-<step>/ folders (after each epoch, atomically) "
                                             "and config.yaml here; a folder holding an earlier run's checkpoints "
                                             "is refused unless resume (nothing is overwritten)")
    keep_checkpoints: int = _f(3, "how many checkpoints to keep")
    checkpoint_format: CheckpointFormat = _f(CheckpointFormat.SINGLE, "single (one state file, written by rank 0) "
                                             "or sharded (torch: every rank writes its own shards through "
                                             "torch.distributed.checkpoint; resumes on any number of ranks and any "
                                             "sharding; needs a folder every rank reads and writes)")
    checkpoint_async: bool = _f(False, "rank 0 writes each checkpoint in a background thread while training goes "
                                       "on (the state copied to host memory first); the same atomic folders, the "
                                       "next save waits for the one before")
    resume: bool = _f(False, "continue from the latest checkpoint in checkpoint_dir")
    preemption_check_every: int = _f(10, "steps between the ranks' checks for SIGTERM (one small allreduce: "
                                         "a few ms over Gloo on a CPU); on SIGTERM every rank stops at the next "
                                         "check, rank 0 checkpoints, exit 75")


@dataclass(frozen=True)
class HorovodConfig:
    """Horovod's own tuning knobs (backend horovod only)."""
    group = "horovod"
    fusion_threshold_mb: Optional[float] = _f(None, "Horovod tensor fusion buffer (MiB; 0 = no fusion); "
                                                    "unset = {unset}", unset="Horovod's (128)")
    cycle_time_ms: Optional[float] = _f(None, "Horovod cycle time (ms); unset = {unset}", unset="Horovod's")
    timeline_file: Optional[str] = _f(None, "Horovod timeline file (JSON for chrome://tracing or Perfetto), "
                                       "written by rank 0 (HOROVOD_TIMELINE)")
    stall_check_seconds: Optional[float] = _f(None, "Horovod warns when a rank waits this long for the others; "
                                                    "0 turns the check off; unset = {unset}", unset="Horovod's (60)")


@dataclass(frozen=True)
class ElasticConfig:
    """Horovod elastic training (YAML: an `elastic:` block of these keys without the prefix)."""
    group = "elastic"
    elastic_min_np: Optional[int] = _f(None, "elastic training (Horovod elastic, gloo): the fewest workers the job "
                                             "goes on with; setting any elastic_* key turns elastic on "
                                             "(YAML: `elastic: {min_np: 1, max_np: 4, discovery: ./hosts.sh}`)")
    elastic_max_np: Optional[int] = _f(None, "elastic: the most workers; unset = {unset}", unset="no limit")
    elastic_discovery: Optional[str] = _f(None, "elastic: executable that prints the available `host:slots`, one a "
                                                "line (horovodrun --host-discovery-script)")
    elastic_commit_every: Optional[int] = _f(None, "elastic: steps between in-memory commits of the training "
                                                   "state (what a failure rolls back to); unset = {unset}", unset=10)


GROUP_CLASSES = (LaunchConfig, WorkloadConfig, CommunicationConfig, ParameterServerConfig, PrecisionConfig,
                 CheckpointConfig, HorovodConfig, ElasticConfig)

# The order of the keys in `config show`, config.yaml, `--help` and "allowed keys" (part of the interface: it
# predates the groups, so it interleaves them).
ORDER = (
    "framework", "backend", "sharding", "keras", "strategy", "num_devices", "model", "hidden_size", "hidden_layers", "heads",
    "context", "dataset", "image_size", "augment", "epochs", "batch_size", "optimizer", "lr", "momentum",
    "weight_decay", "lr_scaling", "warmup_epochs", "lr_schedule", "lr_step_epochs", "lr_step_gamma", "compression",
    "topk_ratio", "dgc", "dgc_warmup_epochs", "dgc_masking", "powersgd_rank", "powersgd_warmup_steps",
    "error_feedback", "hierarchical_exchange", "overlap", "bucket_mb", "sync", "local_steps",
    "sync_warmup_steps", "staleness", "ps_servers", "staleness_lr_damping", "accumulation_steps", "op",
    "precision", "compile", "sync_batchnorm", "clip_grad_norm", "nan_guard", "nan_check_every", "seed", "checkpoint_dir", "keep_checkpoints", "checkpoint_format", "checkpoint_async",
    "resume", "preemption_check_every", "log_dir", "wandb_project", "mlflow_tracking_uri", "mlflow_experiment",
    "mlflow_run_name", "peak_tflops", "profile_dir", "profile_steps",
    "fusion_threshold_mb", "cycle_time_ms",
    "timeline_file", "stall_check_seconds", "elastic_min_np", "elastic_max_np", "elastic_discovery",
    "elastic_commit_every", "uneven_data", "straggler", "allow_cpu", "loader_workers", "quiet", "framework_logs",
)

# name -> (its group's name, the group's dataclasses.Field, the resolved type hint)
KEYS: dict[str, tuple[str, dataclasses.Field, object]] = {
    f.name: (cls.group, f, typing.get_type_hints(cls)[f.name])
    for cls in GROUP_CLASSES for f in dataclasses.fields(cls)}
assert sorted(KEYS) == sorted(ORDER) and len(ORDER) == len(set(ORDER)), "ORDER lists every key once"


def unset_default(name: str):
    """What an unset (None) `name` stands for, from its field: e.g. unset_default("image_size") == 224."""
    return KEYS[name][1].metadata["unset"]


def base_type(name: str):
    """(the key's type without Optional, whether None is allowed)."""
    hint = KEYS[name][2]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def plain(value):
    return value.value if isinstance(value, enum.Enum) else value


def _example(name: str) -> str:
    """A value to show in an error's `e.g. --key VALUE`: the default, or an enum's first member."""
    default = KEYS[name][1].default
    kind, _ = base_type(name)
    if default is None and isinstance(kind, type) and issubclass(kind, enum.Enum):
        return next(iter(kind)).value
    return str(plain(default))


# The elastic keys without their prefix.
ELASTIC_KEYS = tuple(f.name[len("elastic_"):] for f in dataclasses.fields(ElasticConfig))
# YAML groups: `elastic: {min_np: 2}` is the key elastic_min_np.
GROUPS = {"elastic": ELASTIC_KEYS}
