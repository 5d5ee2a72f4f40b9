"""sync_batchnorm for torch: batch statistics over every rank's micro-batch, through the strategy's allreduce.

Horovod's own `hvd.SyncBatchNorm` refuses CPU input ("SyncBatchNorm expected input tensor to be on
GPU": it calls CUDA kernels), and torch's `nn.SyncBatchNorm` needs torch.distributed, which a
Horovod job does not start; under the native backend torch's own needs a GPU too (its CPU kernels
are missing). This layer works on both: each rank sums its inputs, their squares and its count per
channel, one differentiable allreduce (Sum) adds them up (`hvd.allreduce`, or
`torch.distributed.nn.functional.all_reduce`: the strategy's `reduce_sum`), and the batch is
normalised with the union's mean and (biased) variance; the running statistics get the union's
unbiased variance, as torch's BatchNorm does for one large batch. The allreduce's backward
allreduces the gradient, so the backward pass is the large batch's too. `convert` swaps every
BatchNorm of a model for it, keeping the parameter objects (an optimizer made before still holds them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm


class SyncBatchNorm(_BatchNorm):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, *,
                 reduce_sum, world, name):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.reduce_sum, self.world, self.name = reduce_sum, world, name

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, x):
        self._check_input_dim(x)
        training = self.training or not self.track_running_stats
        if not training or self.world() == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, training,
                                self._factor(), self.eps)
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xf = x.float()
        count = torch.tensor([x.numel() // channels], dtype=torch.float32, device=x.device)
        local = torch.cat([xf.sum(dims), (xf * xf).sum(dims), count])
        total = self.reduce_sum(local, self.name)
        n = total[-1]
        mean = total[:channels] / n
        var = (total[channels:2 * channels] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            factor = self._factor()
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(var.detach() * (n / (n - 1)) * factor)
        shape = [1, channels] + [1] * (x.dim() - 2)
        y = (xf - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    def _factor(self) -> float:
        """torch's exponential_average_factor (momentum None: a cumulative average)."""
        if not (self.training and self.track_running_stats):
            return 0.0 if self.momentum is None else self.momentum
        # a tensor while track_running_stats
        self.num_batches_tracked.add_(1)                                    # type: ignore[union-attr]
        return 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum  # type: ignore[arg-type]


def convert(module: torch.nn.Module, reduce_sum, world, prefix: str = "toolkit.sync_bn") -> torch.nn.Module:
    """`module` with every BatchNorm{1,2,3}d replaced by SyncBatchNorm (the same parameters and buffers);
    `reduce_sum(tensor, name)`: a differentiable sum over the ranks; `world()`: their number."""
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, reduce_sum=reduce_sum, world=world,
                            name=prefix)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        if module.track_running_stats:
            out.running_mean, out.running_var = module.running_mean, module.running_var
            out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
        return out
    for name, child in module.named_children():
        module.add_module(name, convert(child, reduce_sum, world, f"{prefix}.{name}"))
    return module
