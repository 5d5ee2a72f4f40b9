"""Check `toolkit plan`'s cost model against Horovod's published scaling (docs/SCALING.md).

    .venv/bin/python -m benchmarks.scaling_published --write-docs        # seconds; needs torchvision

Horovod's README published scaling efficiency for tf_cnn_benchmarks' Inception V3, ResNet-101 and
VGG-16 (batch 64 a GPU, synthetic data) on servers of 4 Pascal GPUs over 25 Gbit/s RoCE: 90 / 90 / 79%
on 32 servers (128 GPUs), then 90 / 90 / 68% on 128 servers (512 GPUs). The model needs, for each
network, its gradients (sizes in backward order: torchvision's definitions, built on the meta device,
so nothing is allocated) and one GPU's step: TensorFlow's own P100 figures of May 2017 (DGX-1,
synthetic data, batch 64, one GPU: Inception V3 142, ResNet-50 219, ResNet-152 91.8, VGG-16 154
images/s). ResNet-101 is not in that table: its time per image is interpolated between ResNet-50 and
ResNet-152 by their FLOPs (He et al. 2016, table 1: 3.8, 7.6 and 11.3 GFLOPs). Horovod of that time
fused up to 64 MiB and ran a cycle every 5 ms (both changed in 0.21.0, horovod#2468) and used one flat
NCCL ring over all GPUs.

Nothing here is fitted to the published efficiencies: the first table is the model with the link at
its line rate; the second shows how the prediction moves with what is not published (the share of
the line rate NCCL got over RoCE, the spread of step times between GPUs).

A second check: NVIDIA's published ResNet-50 v1.5 training throughput with PyTorch DDP on one DGX A100
(1 and 8 GPUs, TF32 and mixed precision, batch 256), against the model with DDP's 25 MiB buckets.
"""
from __future__ import annotations

import argparse
import sys
from datetime import date

from benchmarks import common
from toolkit.exchange import wire
from toolkit.planner import scaling, units

BATCH = 64
GPUS_PER_NODE = 4
LINE_RATE = units.parse_bandwidth("25gbit", "line rate")
PUBLISHED = {                       # model -> {GPUs: scaling efficiency}
    "inception_v3": {128: 0.90, 512: 0.90},
    "resnet101": {128: 0.90, 512: 0.90},
    "vgg16": {128: 0.79, 512: 0.68},
}
LABEL = {"inception_v3": "Inception V3", "resnet101": "ResNet-101", "vgg16": "VGG-16", "resnet50": "ResNet-50"}
P100 = {"inception_v3": 142.0, "resnet50": 219.0, "resnet152": 91.8, "vgg16": 154.0}     # images/s, batch 64
GFLOPS = {"resnet50": 3.8, "resnet101": 7.6, "resnet152": 11.3}


def images_per_s(name: str) -> float:
    if name in P100:
        return P100[name]
    lo, hi = 1 / P100["resnet50"], 1 / P100["resnet152"]           # seconds per image
    share = (GFLOPS[name] - GFLOPS["resnet50"]) / (GFLOPS["resnet152"] - GFLOPS["resnet50"])
    return 1 / (lo + share * (hi - lo))


def gradients(name: str) -> tuple[list[int], list[float]]:
    """Each trainable parameter's size in the order the backward pass produces them (the reverse of
    the forward pass's layers), and when each is ready: the share of the backward pass's compute done
    by then, from each layer's forward FLOPs (backward costs about twice forward, layer by layer, so
    the shares are the same). Built on the meta device: shapes only, nothing allocated."""
    import torch
    import torchvision

    kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
    with torch.device("meta"):
        model = getattr(torchvision.models, name)(weights=None, **kwargs)
    layers = []                                      # (module, forward FLOPs) in the order they ran

    def hook(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            kh, kw = module.kernel_size
            flops = 2 * output.numel() * module.in_channels // module.groups * kh * kw
        elif isinstance(module, torch.nn.Linear):
            flops = 2 * output.numel() * module.in_features
        else:                                        # batch norm: a few operations a value
            flops = 4 * output.numel()
        layers.append((module, flops))

    for m in model.modules():
        if any(True for _ in m.parameters(recurse=False)):
            m.register_forward_hook(hook)
    size = 299 if name == "inception_v3" else 224
    model(torch.empty(BATCH, 3, size, size, device="meta"))
    total, done, values, ready = sum(f for _, f in layers), 0, [], []
    for module, flops in reversed(layers):
        done += flops
        for p in reversed(list(module.parameters(recurse=False))):
            if p.requires_grad:
                values.append(p.numel())
                ready.append(done / total)
    return values, ready


def horovod_2017(name: str = "horovod 2017") -> scaling.Method:
    return scaling.Method(name, "horovod", fusion_bytes=64 * 2 ** 20, cycle_s=5e-3)


def efficiency(grads: tuple, rate: float, n: int, bandwidth: float, straggle: float = 0.0,
               by_bytes: bool = False, alpha: float = 5e-6) -> float:
    values, ready = grads
    cluster = scaling.Cluster(GPUS_PER_NODE, wire.Link(alpha, bandwidth),
                              wire.Link(2e-6, units.parse_bandwidth("10GB/s", "PCIe")))
    workload = scaling.Workload(compute_s=BATCH / rate, tensor_values=tuple(values), straggle=straggle,
                                ready=() if by_bytes else tuple(ready))
    return scaling.step_time(workload, horovod_2017(), cluster, n).efficiency


def dgx_a100(rate: float, batch: int) -> float:
    """PyTorch DDP on one DGX A100 (8 GPUs, NVLink; 300 GB/s, `toolkit plan`'s default within a node):
    DDP's 25 MiB buckets, each sent when full (no cycle)."""
    values, ready = gradients("resnet50")
    cluster = scaling.Cluster(8, wire.Link(5e-6, LINE_RATE), wire.Link(2e-6, 300e9))
    workload = scaling.Workload(compute_s=batch / rate, tensor_values=tuple(values), ready=tuple(ready))
    ddp = scaling.Method("ddp", "horovod", fusion_bytes=25 * 2 ** 20, cycle_s=0.0)
    return scaling.step_time(workload, ddp, cluster, 8).efficiency


def report() -> str:
    lines = [f"Computed {date.today().isoformat()} with `.venv/bin/python -m benchmarks.scaling_published "
             f"--write-docs` (torchvision's parameter shapes and layer FLOPs; 4 GPUs a node; 25 Gbit/s, 5 us a "
             f"message between nodes; 10 GB/s PCIe within; Horovod of 2017: 64 MiB fusion, 5 ms cycle, one flat "
             f"ring; backward 2/3 of the step). Predicted columns: A, the link at its line rate, each gradient "
             f"ready when the backward FLOPs before it are done; B, as A but ready in proportion to bytes "
             f"(`toolkit plan`'s assumption, which knows no FLOPs); C, as A with 75% of the line rate and a 3% "
             f"spread of step times.", ""]
    models, rows = {name: gradients(name) for name in PUBLISHED}, []
    for name, grads in models.items():
        rate, total = images_per_s(name), sum(grads[0])
        for n, published in PUBLISHED[name].items():
            cells = [efficiency(grads, rate, n, LINE_RATE), efficiency(grads, rate, n, LINE_RATE, by_bytes=True),
                     efficiency(grads, rate, n, 0.75 * LINE_RATE, straggle=0.03)]
            rows.append([LABEL[name], f"{total / 1e6:.1f}M", f"{4 * total / 2 ** 20:.0f} MiB",
                         f"{rate:.0f}{'' if name in P100 else ' (interpolated)'}", n, f"{100 * published:.0f}%",
                         *(f"{100 * c:.0f}%" for c in cells)])
    lines.append(common.table(["model", "parameters", "fp32 gradients", "P100 images/s (batch 64)", "GPUs",
                               "published", "A", "B", "C"], rows))
    lines += ["", "How the 512-GPU prediction (A) moves with what was not published: the share of the 25 Gbit/s "
                  "line rate the ring got (columns) and the spread of one GPU's step time (coefficient of "
                  "variation; a step waits for the slowest of 512).", ""]
    rows = []
    for name, grads in models.items():
        for straggle in (0.0, 0.02, 0.05):
            cells = [f"{100 * efficiency(grads, images_per_s(name), 512, share * LINE_RATE, straggle):.0f}%"
                     for share in (1.0, 0.9, 0.75, 0.5)]
            rows.append([LABEL[name], f"{100 * straggle:.0f}%", *cells])
    lines.append(common.table(["model", "spread", "100%", "90%", "75%", "50%"], rows))
    lines += ["", "PyTorch DDP on one DGX A100 (8 x A100 80GB, NVLink), ResNet-50 v1.5, batch 256 a GPU: NVIDIA's "
                  "DeepLearningExamples (PyTorch/Classification/ConvNets/resnet50v1.5, pytorch-21.03 container).", ""]
    rows = [[precision, one, eight, f"{100 * eight / (8 * one):.0f}%", f"{100 * dgx_a100(one, 256):.0f}%"]
            for precision, one, eight in (("TF32", 938, 7248), ("mixed (AMP)", 2470, 16621))]
    lines.append(common.table(["precision", "1 GPU images/s", "8 GPUs images/s", "published efficiency", "predicted"],
                              rows))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/SCALING.md")
    a = parser.parse_args()
    text = report()
    print(text)
    if a.write_docs:
        common.write_between("SCALING.md", "published", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
