"""DDP's own comm hooks for the config's compressions (torch's native backend), and the bytes each sends.

- fp16, bf16: `default_hooks.fp16_compress_hook` / `bf16_compress_hook`: each gradient bucket cast to 16
  bits, allreduced, cast back: 2 bytes a value.
- powersgd: `powerSGD_hook` (Vogels et al. 2019, as torch ships it): each gradient viewed as an n x m matrix
  is sent as P (n x r) and Q (m x r) when (n + m) r * 2 < n m, the rest whole; error feedback and warm
  start on. Its iteration counter must pass `start_powerSGD_iter` >= 2 uncompressed steps (DDP rebuilds its
  buckets in the first), so `powersgd_warmup_steps` below 2 becomes 2 here.
  On Gloo the hook works with ONE gradient bucket only (torch 2.14): it starts each bucket's P and Q
  allreduces from future callbacks that wait on Gloo's two worker threads, so with two buckets in
  flight the ranks issue collectives in different orders (Gloo's `op.preamble.length <= op.nbytes`, the
  failure the peer script saw, pytorch/gloo#456) or deadlock with both threads waiting. `ddp_options`
  gives DDP one bucket on Gloo (`bucket_cap_mb` above the gradients' size; an explicit cap also sets the
  first bucket's); parameters of several dtypes (one bucket each) go to the toolkit's PowerSGD instead.
  NCCL completes its futures as it enqueues: default buckets. `batched_powerSGD_hook` is not offered
  (torch 2.14.1 hands `_orthogonalize` a 2-D Q it asserts is 3-D).
"""
from __future__ import annotations

import math

from toolkit.config import Compression

DEFAULT_HOOKS = {Compression.FP16: "fp16_compress_hook", Compression.BF16: "bf16_compress_hook"}
MIN_COMPRESSION_RATE = 2        # torch's PowerSGDState default


def chosen(config) -> str | None:
    """The DDP hook for the config's compression (sync every_step), or None (the toolkit's exchange or none)."""
    if config.sync.value != "every_step":
        return None
    if config.compression is Compression.POWERSGD:
        return "powerSGD_hook"
    return DEFAULT_HOOKS.get(config.compression)


def fits(hook: str, model, backend: str) -> bool:
    """Whether DDP's hook works for this model here (PowerSGD on Gloo: one bucket, so one dtype and device)."""
    if hook != "powerSGD_hook" or backend != "gloo":
        return True
    return len({(p.dtype, p.device) for p in model.parameters() if p.requires_grad}) == 1


def ddp_options(hook: str | None, model, backend: str) -> dict:
    """DDP's constructor options the hook needs: PowerSGD on Gloo gets one bucket."""
    if hook != "powerSGD_hook" or backend != "gloo":
        return {}
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"bucket_cap_mb": math.floor(grad_bytes / 2**20) + 1}


def register(ddp, hook: str, config) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if hook != "powerSGD_hook":
        ddp.register_comm_hook(None, getattr(default_hooks, hook))      # the default process group
        return
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank(config),
                                        start_powerSGD_iter=start(config),
                                        min_compression_rate=MIN_COMPRESSION_RATE,
                                        use_error_feedback=config.error_feedback is not False, warm_start=True,
                                        random_seed=config.seed)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def rank(config) -> int:
    return config.powersgd_rank or 1


def start(config) -> int:
    return max(2, config.powersgd_warmup_steps)


def step_bytes(hook: str | None, config, model):
    """step -> bytes this rank hands to the hook's allreduces at this process's optimizer step `step` (the
    hook's own count: PowerSGD's first `start` steps are dense)."""
    grads = [p for p in model.parameters() if p.requires_grad]
    dense = 4 * sum(p.numel() for p in grads)
    if hook in ("fp16_compress_hook", "bf16_compress_hook"):
        return lambda step: dense // 2
    if hook != "powerSGD_hook":
        return lambda step: dense
    compressed = 0
    for p in grads:
        n = p.shape[0] if p.dim() else 1
        m = p.numel() // n
        r = min(n, m, rank(config))
        whole = (n + m) * r * MIN_COMPRESSION_RATE >= n * m
        compressed += 4 * (n * m if whole else (n + m) * r)
    first = start(config)
    return lambda step: dense if step < first else compressed
