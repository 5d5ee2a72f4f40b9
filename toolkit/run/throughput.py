"""Throughput as the field reports it (Lightning's ThroughputMonitor, from MosaicML Composer): samples/s,
tokens/s for token models, the model FLOPs of one sample, and `mfu`, the model FLOPs a device achieves over
its peak. The counts come from the framework's session (`Session.throughput_basis`: torch's FlopCounterMode
on one batch); this module only does the arithmetic and knows the peaks."""
from __future__ import annotations

# One device's dense 16-bit (bf16/fp16 tensor core) peak, TFLOP/s, from NVIDIA's data sheets, by a word of
# torch.cuda.get_device_name(); the first that occurs in the name wins (H200 before H100's "H1").
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0,
               "V100": 125.0}


def peak(configured: float | None, device_name: str | None) -> float | None:
    """TFLOP/s of one device: the config's `peak_tflops`, else a known GPU's by name, else None."""
    if configured:
        return configured
    for word, tflops in PEAK_TFLOPS.items():
        if device_name and word in device_name:
            return tflops
    return None


def figures(samples_per_sec: float, devices: int, flops_per_sample: float | None, tokens_per_sample: int | None,
            peak_tflops: float | None) -> dict:
    """What the summary, metrics.jsonl and the trackers add beside `samples_per_sec` (the job's, over every
    device): `tokens_per_sec`, `flops_per_sample` (training: forward and backward) and `mfu` (per device),
    each only where it is known."""
    out: dict = {}
    if tokens_per_sample:
        out["tokens_per_sec"] = samples_per_sec * tokens_per_sample
    if flops_per_sample:
        out["flops_per_sample"] = flops_per_sample
        if peak_tflops and devices:
            out["mfu"] = flops_per_sample * samples_per_sec / devices / (peak_tflops * 1e12)
    return out
