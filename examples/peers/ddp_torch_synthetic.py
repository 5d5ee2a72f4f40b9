"""(c) torch DistributedDataParallel under torchrun (gloo on CPU, nccl on GPU), no Horovod, no toolkit.

    torchrun --nproc-per-node 2 examples/peers/ddp_torch_synthetic.py [--fp16-allreduce]
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from common import arguments, threads, time_steps, write
from torch_model import model_and_batch

args = arguments(__doc__)
dist.init_process_group("gloo")
rank, local_size = dist.get_rank(), int(os.environ["LOCAL_WORLD_SIZE"])
torch.set_num_threads(threads(local_size))
torch.manual_seed(rank)

net, data, target = model_and_batch(args)
model = torch.nn.parallel.DistributedDataParallel(net)
if args.fp16_allreduce:
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
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
