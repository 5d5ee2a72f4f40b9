"""How each optimizer step's gradients cross the wire, chosen once from the config and counted in bytes.

One class, three ways, chosen by the session's strategy (adapters/strategy.py, `exchange`, read here as
`toolkit`); the facade (adapters/base.py `Session._finish_step`) asks which way runs and calls the
public verbs below:

- The strategy's own reduce (Horovod's distributed optimizer, DDP; compression none or fp16, any
  op): the facade runs its step and calls `count_backend_step`. It sends the dense gradients: 4
  bytes a value, 2 with fp16.
- The toolkit's exchange (compression bf16, int8, topk): the facade hands over this rank's
  gradients (`local_gradients`, accumulation included, so compression happens once per optimizer
  step) to `exchange_and_apply`: `toolkit.exchange.exchanges.GradientExchange` compresses, exchanges
  and averages them with error feedback, and the session's `apply_gradients` applies the result.
- Local SGD (Stich 2019; post-local SGD, Lin et al. 2020): after `sync_warmup_steps` synchronous
  steps (exchanged as above, compressed if asked), each rank applies its own gradients and every
  `local_steps` steps the ranks average their models, parameters and optimizer slots, with one
  allreduce. Also at each epoch's end, so evaluation and checkpoints see one model. Averaging the
  optimizer slots too keeps every rank's state identical after an average (resume is exact), and
  makes local_steps=1 equal synchronous training for SGD with momentum (all of it is linear).

`bytes_sent` counts the payload each rank hands to a collective: the compressed bytes (plus the
small length header) for the toolkit's exchange, the dense bytes for Horovod's path (nothing in a
1-rank job, where Horovod skips the allreduce) and for model averages. `wire_sent` counts what those
collectives send over the links (toolkit/exchange/wire.py: allreduce 2(N-1)/N, allgather N-1
payloads, alltoall (N-1)/N). The tests check the Horovod path's figure against
what Horovod's own timeline says it reduced (tests/conftest.py `timeline_gradient_bytes`).
"""
from __future__ import annotations

from pathlib import Path

from toolkit.config import Compression, Config, Sync
from toolkit.exchange import arrays, buckets, hierarchy, numerics, wire
from toolkit.exchange.exchanges import GradientExchange, PowerSGDExchange, make_exchange

STATE_FILE = "communication.npz"


def for_session(config: Config, session, exchange: bool, step_calls=None) -> "Communication":
    """The session's communication; `exchange`: the strategy's answer, whether the toolkit's exchange
    moves the gradients (else the strategy's own reduce does, inside the session's step);
    `step_calls(step)`: the collectives the strategy's own reduce runs at optimizer step `step`, as
    (kind, bytes handed over) (counted from this process's start; default: Horovod's allreduce,
    `horovod_value_bytes` a value)."""
    return Communication(config, session, session.rank, session.world_size, exchange, step_calls)


class Communication:
    def __init__(self, config: Config, session, rank: int, world_size: int, exchange: bool, step_calls=None):
        self.session, self.rank, self.world = session, rank, world_size
        self.toolkit = exchange
        self.local_steps = config.local_steps if config.sync is Sync.LOCAL_SGD else None
        self.warmup_steps = config.sync_warmup_steps
        self.clip_grad_norm, self.nan_guard = config.clip_grad_norm, config.nan_guard
        self.ops = arrays.of(session)
        self.dgc = config.dgc
        # None where the strategy's own reduce moves the gradients (self.toolkit False): never called then
        sizes = [int(a.size) for a in session.weights()]
        self.values = sum(sizes)    # gradient values per step
        self.exchange: GradientExchange = (make_exchange(config, self.ops)  # type: ignore[assignment]
                                           if self.toolkit else None)
        hier = None
        if self.toolkit and config.hierarchical_capable and config.hierarchical_exchange is not False and self.world > 1:
            # a GradientExchange's verbs and attributes, around one that runs across hosts
            hier = hierarchy.make(config, session, self.ops, self.values)
            self.exchange = hier or self.exchange       # type: ignore[assignment]
        if self.toolkit and self._overlaps(config, session):
            cap = int(config.bucket_mb * 2**20) // 4
            # unset: on a GPU where the gradient fills several buckets; not on the CPU, where the exchange's
            # compression takes the cores the backward pass runs on (docs/COMMUNICATION.md measures it)
            if config.overlap or (hierarchy.on_gpu(session.device) and len(buckets.plan(sizes, cap)) > 1):
                bucketed = buckets.BucketedExchange(
                    lambda m: hierarchy.HierarchicalExchange(hierarchy.summing(config, self.ops), hier.levels, hier.average, m)
                    if hier else make_exchange(config, self.ops), sizes, cap, self.ops)
                bucketed.bind(session, self.world)
                self.exchange = bucketed        # type: ignore[assignment]
        self.step_calls = step_calls
        self.since_average = 0      # local SGD: steps since the models were last averaged
        self.bytes_sent = 0         # by this rank, since this process started
        self.wire_sent = 0.0        # what those collectives sent over the links (toolkit/exchange/wire.py)
        self.cross_sent = 0         # the hierarchical exchange: what this rank handed to collectives across hosts
        self.steps = 0              # optimizer steps since this process started
        if self.step_calls is None:     # Horovod's own reduce: dense, 2 bytes a value with fp16
            calls = [("allreduce", self.values * horovod_value_bytes(config))]
            self.step_calls = lambda step: calls

    def _overlaps(self, config: Config, session) -> bool:
        """Whether the exchange runs in buckets beside the backward pass: torch (its session feeds the
        buckets from gradient hooks), an exchange that splits at any block (overlap_capable), more than one rank."""
        return (config.overlap is not False and config.overlap_capable and self.world > 1
                and getattr(session, "gradient_hooks", False))

    @property
    def overlapped(self) -> bool:
        return isinstance(self.exchange, buckets.BucketedExchange)

    def arm(self, on: bool) -> None:
        """Before each backward pass: whether it is the step's last micro-batch (the one whose gradients
        are exchanged; accumulation's earlier ones only add up)."""
        if self.overlapped:
            self.exchange.arm(on)       # type: ignore[attr-defined]  # a BucketedExchange

    def gradient_ready(self, index: int, grad) -> None:
        """The backward pass made parameter `index`'s gradient final (its hook): its bucket may start."""
        self.exchange.ready(index, grad)     # type: ignore[attr-defined]  # overlapped: a BucketedExchange

    def _hierarchical(self):
        """The hierarchical exchange that runs (a bucket's, where the exchange is in buckets), or None."""
        x = self.exchange.inner if self.overlapped else self.exchange     # type: ignore[attr-defined]
        return x if isinstance(x, hierarchy.HierarchicalExchange) else None

    # -- the facade's calls, once per optimizer step ----------------------------------------------
    def count_backend_step(self) -> None:
        """The strategy's own reduce moved this step's gradients: its collectives counted."""
        if self.world > 1:      # nothing crosses the wire in a 1-rank job (Horovod skips the allreduce)
            self._count(self.step_calls(self.steps))     # counted from this process's start, as hooks count
        self.steps += 1

    def _count(self, calls) -> None:
        """(kind, bytes handed over) among every rank, or (kind, bytes, group size, "host" or "cross")."""
        for kind, nbytes, *among in calls:
            self.bytes_sent += nbytes
            self.wire_sent += wire.sent(kind, nbytes, among[0] if among else self.world)
            if among and among[1] == "cross":
                self.cross_sent += nbytes

    def exchange_and_apply(self, grads, step: int):
        """The toolkit's exchange of this rank's gradients `grads` at global step `step` (local SGD past
        its warm-up: this rank's own), clipped and applied through the session's `apply_gradients`.
        Returns their norm before clipping where measured (clip_grad_norm or nan_guard), else None."""
        self.steps += 1
        if self.local_steps and step >= self.warmup_steps:
            grads, norm = self._clip([self.ops.asarray(g) for g in grads])
            self.session.apply_gradients(grads)
            self.since_average += 1
            if self.since_average == self.local_steps:
                self.average_models()
            return norm
        if self.dgc:
            self.exchange.epoch = self._epoch(step)     # type: ignore[attr-defined]  # a DGCExchange (make_exchange)
        if isinstance(self.exchange, PowerSGDExchange):
            self.exchange.step = step
        grads = self.exchange.exchange(grads, self.session, self.world)
        self._count(self.exchange.calls)
        grads, norm = self._clip(grads)
        self.session.apply_gradients(grads)
        return norm

    def _epoch(self, step: int) -> int:
        """The epoch of global step `step`, from the session's (last) training loader; 0 without one."""
        loaders = getattr(self.session, "loaders", None)
        return step // loaders[-1].steps_per_epoch if loaders else 0

    def _clip(self, grads: list) -> tuple[list, float | None]:
        """The reduced (local SGD: this rank's) gradients clipped to clip_grad_norm (DGC clipped each rank's
        own before the exchange), and their norm before (None where neither clipping nor the guard asks)."""
        if self.clip_grad_norm is not None or self.nan_guard:
            return numerics.clip(grads, None if self.dgc else self.clip_grad_norm, self.ops)
        return grads, None

    def end_epoch(self) -> None:
        """Local SGD: one model on every rank before evaluation and checkpoints."""
        if self.since_average:
            self.average_models()

    def average_models(self) -> None:
        ops = arrays.numpy_ops()
        state = self.session.get_state()
        flat = ops.flatten(state)
        if self.world > 1:
            flat = self.session.allreduce(flat, average=True)
            self._count([("allreduce", flat.nbytes)])
        self.session.set_state(ops.unflatten(flat, state))
        self.since_average = 0

    def describe(self, session_path: str) -> str:
        """The JSON summary's `path`: the session's own, or what the toolkit does on top of it."""
        if not self.toolkit:
            return session_path
        how = (f"local SGD (average every {self.local_steps} steps)" if self.local_steps else "every step")
        over = self.session.strategy.collectives or f"{self.session.name}'s Horovod"
        return f"toolkit {self.method} exchange, {how}, over {over} collectives"

    @property
    def method(self) -> str:
        if isinstance(self.exchange, PowerSGDExchange):
            return f"powersgd rank {self.exchange.rank}"
        forms: dict[str | None, str] = {"reduce": " (compressed allreduce)", "allgather": " (allgather)"}
        over = (f", in {len(self.exchange.buckets)} buckets beside the backward pass"    # type: ignore[attr-defined]
                if self.overlapped else "")
        if hier := self._hierarchical():
            lv, across = hier.levels, forms.get(hier.cross_form, " (float32 allreduce)")
            hosts = f"{lv.hosts} host{'s' * (lv.hosts > 1)} x {lv.ranks_per_host} rank{'s' * (lv.ranks_per_host > 1)}"
            return (f"{hier.compressor.name} hierarchical ({hosts}: "
                    f"float32 inside a host, {hier.compressor.name}{across} across hosts{over})")
        form = forms.get(self.exchange.form, "")
        return f"{self.exchange.compressor.name}{' (DGC)' if self.dgc else ''}{form}{over}"

    def summary(self) -> dict:
        """Bytes this rank handed to collectives per optimizer step (0 at world size 1: nothing crosses
        the wire), what they sent over the links (toolkit/exchange/wire.py), their ratio to dense
        float32, and the milliseconds per step spent compressing and decompressing (0 for Horovod's
        path, whose fp16 casts happen inside Horovod)."""
        per_step = self.bytes_sent / self.steps if self.steps else 0.0
        seconds = self.exchange.timer.seconds if self.exchange else 0.0
        out = {"bytes_sent_per_step": per_step,
               "wire_bytes_per_step": self.wire_sent / self.steps if self.steps else 0.0,
               "compression_ratio": self.values * 4 / per_step if per_step else None,
               "compression_ms_per_step": 1000 * seconds / self.steps if self.steps else 0.0}
        if self.overlapped:     # buckets whose exchange the backward pass started (all of them: full overlap)
            out["overlapped_buckets_per_step"] = self.exchange.early / self.steps if self.steps else 0.0  # type: ignore[attr-defined]
        if self._hierarchical():
            # what crosses hosts is this rank's shard: its ratio to that shard's float32 bytes
            cross = self.cross_sent / self.steps if self.steps else 0.0
            shard = (sum(x.shard_values for x in self.exchange.exchanges)     # type: ignore[attr-defined]
                     if self.overlapped else self.exchange.shard_values)      # type: ignore[attr-defined]
            out.update(cross_host_bytes_per_step=cross, compression_ratio=shard * 4 / cross if cross else None)
        return out

    # -- checkpoints: error-feedback residuals (one per rank) and the local SGD counter ---------
    def gather_state(self):
        """Collective (every rank calls it): {name: array} for rank 0 to save, or None if stateless.
        Each of the exchange's per-rank buffers (residuals; DGC's momenta; PowerSGD's Q) is saved as
        one row per rank."""
        import numpy as np
        if not self.stateful:
            return None
        state = {name: self.ops.to_numpy(buf).astype(np.float32) for name, buf in self.exchange.state().items()}
        if "residuals" not in state:
            state["residuals"] = np.zeros(self.values, np.float32)
        out = {}
        for name in sorted(state):
            flat = np.ascontiguousarray(state[name]).view(np.uint8)
            rows = flat if self.world == 1 else self.session.allgather(flat)
            out[name] = np.frombuffer(np.asarray(rows).tobytes(), np.float32).reshape(self.world, -1)
        out["since_average"] = np.array(self.since_average)
        return out

    @property
    def stateful(self) -> bool:
        return bool(self.exchange) and (self.exchange.error_feedback or self.dgc
                                        or isinstance(self.exchange, PowerSGDExchange))

    @staticmethod
    def write(folder: Path, state) -> None:
        import numpy as np
        if state is not None:
            with open(folder / STATE_FILE, "wb") as f:
                np.savez(f, **state)

    @staticmethod
    def read(folder: Path):
        import numpy as np
        if not (folder / STATE_FILE).is_file():
            return None
        with np.load(folder / STATE_FILE) as data:
            return {k: data[k] for k in data.files}

    def load(self, state) -> str | None:
        """Take this rank's exchange state from a saved one; returns a note when it cannot (starts from zero)."""
        if not self.stateful:
            return None
        if state is None:
            return "the checkpoint has no error-feedback residuals (saved without them): starting from zero"
        residuals = state["residuals"]
        if residuals.shape != (self.world, self.values):
            return (f"the checkpoint's error-feedback residuals are for {residuals.shape[0]} ranks x "
                    f"{residuals.shape[1]} values, this job has {self.world} x {self.values}: starting from zero")
        self.exchange.load_state({name: self.ops.from_numpy(state[name][self.rank].copy())
                                  for name in state if name != "since_average" and state[name].ndim == 2})
        self.since_average = int(state["since_average"])
        return None


def horovod_value_bytes(config: Config) -> int:
    """Bytes a gradient value takes on Horovod's own path: 2 with its fp16 compression, else 4."""
    return 2 if config.compression is Compression.FP16 else 4
