"""Plain Horovod + TensorFlow 2 (Keras 3 model), no toolkit code, in the manner of Horovod's
examples/tensorflow2/tensorflow2_synthetic_benchmark.py: hvd.DistributedGradientTape in a tf.function.

    horovodrun -np 2 python benchmarks/peers/horovod_tf_synthetic.py [--fp16-allreduce]
"""
import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from common import arguments, threads, time_steps, write
from tf_model import batch, loss_of, mlp, set_threads

args = arguments(__doc__)
hvd.init()
set_threads(threads(hvd.local_size()))
keras.utils.set_random_seed(hvd.rank())
model = mlp(args)
optimizer = keras.optimizers.SGD(learning_rate=args.lr, momentum=args.momentum)
optimizer.build(model.trainable_variables)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
x, y = batch(args, hvd.rank())
# Keras 3 variables: Horovod's TF ops take the tf.Variable underneath (`.value`).
variables = [v.value for v in model.trainable_variables]


@tf.function
def step_fn():
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
hvd.broadcast_variables([v.value for v in optimizer.variables], root_rank=0)
rates = time_steps(args, lambda: float(step_fn()))
everyone = hvd.allgather_object(rates, name="rates")
if hvd.rank() == 0:
    write(args, everyone)
