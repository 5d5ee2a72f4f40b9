"""(b) Plain Horovod + PyTorch, no toolkit code, in the manner of Horovod's
examples/pytorch/pytorch_synthetic_benchmark.py: an MLP (or torchvision's `--model resnet50`) on one
fixed random batch.

    horovodrun -np 2 python benchmarks/peers/horovod_torch_synthetic.py [--fp16-allreduce]
"""
import horovod.torch as hvd
import torch
import torch.nn.functional as F
from common import arguments, threads, time_steps, write
from torch_model import model_and_batch

args = arguments(__doc__)
hvd.init()
torch.set_num_threads(threads(hvd.local_size()))
torch.manual_seed(hvd.rank())

model, data, target = model_and_batch(args)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


rates = time_steps(args, step)
everyone = hvd.allgather_object(rates, name="rates")
if hvd.rank() == 0:
    write(args, everyone)
