"""(d) TensorFlow's own MultiWorkerMirroredStrategy (Keras 3 model, custom loop), no Horovod, no toolkit.
Each worker reads TF_CONFIG; `toolkit launch --backend native -np 2 -- python this.py` writes it.

    toolkit launch --backend native -np 2 -- python benchmarks/peers/mwms_tf_synthetic.py
"""
import json
import os

import tensorflow as tf
from common import arguments, threads, time_steps, write
from tf_model import batch, loss_of, mlp, set_threads

args = arguments(__doc__)
workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
set_threads(threads(workers))        # one host here; a real cluster has one worker per host
options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
rank = strategy.cluster_resolver.task_id
with strategy.scope():
    import keras
    keras.utils.set_random_seed(0)   # MWMS starts replicas equal by construction: same seed
    model = mlp(args)
    optimizer = keras.optimizers.SGD(learning_rate=args.lr, momentum=args.momentum)
    optimizer.build(model.trainable_variables)
x, y = batch(args, rank)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y) / strategy.num_replicas_in_sync   # Keras sums over replicas
    grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def step_fn():
    return strategy.run(replica_step, args=(x, y))


rates = time_steps(args, lambda: float(strategy.reduce("SUM", step_fn(), axis=None)))
gathered = strategy.gather(tf.constant([rates], tf.float64), axis=0)   # [workers, iters] on every worker
if rank == 0:
    write(args, gathered.numpy().tolist())
