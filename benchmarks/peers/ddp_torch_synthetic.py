"""(c) torch DistributedDataParallel under torchrun (gloo on CPU, nccl on GPU), no Horovod, no toolkit.

    torchrun --nproc-per-node 2 benchmarks/peers/ddp_torch_synthetic.py [--fp16-allreduce | --hook HOOK]

--hook: DDP's own communication hooks, the peer of the toolkit's compression (benchmarks/compression_bench.py):
fp16 / bf16 (default_hooks.*_compress_hook) or PowerSGD of rank 1, 2 or 4 (powerSGD_hook, error feedback and
warm start on, compressing from the 10th step: keep --warmup above 10 so every timed step is compressed).
On Gloo (CPU) torch 2.14.1's PowerSGD hook works with ONE gradient bucket only: it starts each bucket's P
and Q allreduces from future callbacks that wait on Gloo's two worker threads, so with two buckets in
flight the ranks issue collectives in different orders ("op.preamble.length <= op.nbytes. 4116 vs 4096":
bucket 0's P against bucket 1's uncompressed tensors) or deadlock. So PowerSGD here runs with
`bucket_cap_mb` above the model's gradients (an explicit cap also sets DDP's 1 MiB first bucket), as the
toolkit's native backend does (adapters/torch/comm_hooks.py); the batched hook fails its own assertion in
_orthogonalize in 2.14.1 and is not offered.
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import arguments, threads, time_steps, write
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch_model import model_and_batch

args = arguments(__doc__)
dist.init_process_group("gloo")
rank, local_size = dist.get_rank(), int(os.environ["LOCAL_WORLD_SIZE"])
torch.set_num_threads(threads(local_size))
torch.manual_seed(rank)

net, data, target = model_and_batch(args)
one_bucket = {"bucket_cap_mb": sum(p.numel() * 4 for p in net.parameters()) // 2**20 + 1} \
    if args.hook and args.hook.startswith("powersgd") else {}
model = torch.nn.parallel.DistributedDataParallel(net, **one_bucket)
if args.fp16_allreduce or args.hook == "fp16":
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
elif args.hook == "bf16":
    model.register_comm_hook(None, default_hooks.bf16_compress_hook)
elif args.hook:
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(args.hook[-1]),
                                        start_powerSGD_iter=10)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)


def step():
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()


rates = time_steps(args, step)
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, rates)
if rank == 0:
    write(args, everyone)
dist.destroy_process_group()
