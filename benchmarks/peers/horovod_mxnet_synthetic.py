"""(e) Plain Horovod + MXNet Gluon, no toolkit code, in the manner of Horovod's
examples/mxnet/mxnet_imagenet_resnet50.py (hvd.DistributedTrainer, hybridized model).

    horovodrun -np 2 python benchmarks/peers/horovod_mxnet_synthetic.py [--fp16-allreduce]
"""
import os

from common import arguments, threads

args = arguments(__doc__)
os.environ.setdefault("OMP_NUM_THREADS", str(threads(int(os.environ.get("HOROVOD_LOCAL_SIZE", "1")))))

import horovod.mxnet as hvd  # noqa: E402  (after OMP_NUM_THREADS, which MXNet reads at import)
import mxnet as mx  # noqa: E402
from common import time_steps, write  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

hvd.init()
mx.random.seed(hvd.rank())
if args.model == "mlp":
    net = gluon.nn.HybridSequential()
    for _ in range(args.hidden_layers):
        net.add(gluon.nn.Dense(args.hidden_size, activation="relu"))
    net.add(gluon.nn.Dense(args.classes))
    data = mx.nd.random.normal(shape=(args.batch_size, args.features))
else:       # Gluon's model zoo, as Horovod's mxnet_imagenet_resnet50.py
    net = getattr(gluon.model_zoo.vision, f"{args.model}_v1")(classes=args.classes)
    data = mx.nd.random.normal(shape=(args.batch_size, 3, args.image_size, args.image_size))
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
net.hybridize()
target = mx.nd.random.randint(0, args.classes, shape=(args.batch_size,)).astype("float32")
net(data)     # deferred initialisation, so the parameters exist before the broadcast
params = net.collect_params()
hvd.broadcast_parameters(params, root_rank=0)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": args.lr, "momentum": args.momentum},
                                 compression=compression)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()


def step():
    with autograd.record():
        loss = loss_fn(net(data), target)
    loss.backward()
    trainer.step(args.batch_size)
    mx.nd.waitall()


rates = time_steps(args, step)
everyone = hvd.allgather_object(rates, name="rates")
if hvd.rank() == 0:
    write(args, everyone)
