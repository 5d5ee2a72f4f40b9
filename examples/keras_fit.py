"""Keras `model.fit` on Horovod, the pattern for your own Keras script: Keras 3 with the toolkit's
pieces (horovod.tensorflow.keras fails on Keras 3), or legacy tf-keras with Horovod's own.

    horovodrun -np 2 --gloo python examples/keras_fit.py --epochs 10                  # Keras 3
    horovodrun -np 2 --gloo python examples/keras_fit.py --keras tf_keras --epochs 10  # tf-keras

(The toolkit's trainer uses a custom step instead; both share adapters/tensorflow.py.)
Ends with one JSON line on rank 0: accuracy, and every rank's initial and final weight digests.
"""
import argparse
import json
import sys

from toolkit import data as datasets
from toolkit.config import Config
from toolkit.trainer import digest


def keras3_pieces(lr: float):
    import keras

    import horovod.tensorflow as hvd
    from adapters.tensorflow import BroadcastCallback, DistributedOptimizer, MetricAverageCallback, build_model

    hvd.init()
    return (hvd, keras, build_model, DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)),
            [BroadcastCallback(), MetricAverageCallback()])


def tf_keras_pieces(lr: float):
    from adapters.tf_keras import build_model, import_horovod_keras   # sets TF_USE_LEGACY_KERAS=1 first
    import tf_keras

    hvd = import_horovod_keras()
    hvd.init()
    return (hvd, tf_keras, build_model, hvd.DistributedOptimizer(tf_keras.optimizers.SGD(lr, momentum=0.9)),
            [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras", choices=("keras3", "tf_keras"), default="keras3",
                        help="Keras 3 with the toolkit's pieces, or legacy tf-keras with Horovod's (default keras3)")
    parser.add_argument("--epochs", type=int, default=10, help="passes over this rank's half of digits (default 10)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate, momentum 0.9 (default 0.05)")
    parser.add_argument("--precision", default="float32", choices=("float32", "mixed_bfloat16", "mixed_float16"),
                        help="Keras dtype policy (mixed_float16 wraps the optimizer in a loss scale optimizer)")
    args = parser.parse_args()

    pieces = keras3_pieces if args.keras == "keras3" else tf_keras_pieces
    hvd, keras, build_model, optimizer, callbacks = pieces(args.lr)
    keras.mixed_precision.set_global_policy(args.precision)
    config = Config(framework="tensorflow")
    data = datasets.load(config)
    keras.utils.set_random_seed(config.seed + hvd.rank())      # different initial weights on purpose
    model = build_model(config, data.num_features, data.num_classes)
    initial = digest(model.get_weights())
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    shard = slice(hvd.rank(), None, hvd.size())                  # this rank's share of the data
    model.fit(data.x_train[shard], data.y_train[shard], batch_size=args.batch_size, epochs=args.epochs,
              shuffle=True, verbose=2 if hvd.rank() == 0 else 0, callbacks=callbacks)
    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    import horovod.tensorflow as hvd_tf    # object collectives live in the core module

    initial_digests = hvd_tf.allgather_object(initial, name="initial")
    final_digests = hvd_tf.allgather_object(digest(model.get_weights()), name="final")
    if hvd.rank() == 0:
        sys.stdout.write(json.dumps({"world_size": hvd.size(), "keras": args.keras, "precision": args.precision,
                                     "accuracy": accuracy,
                                     "initial_digests": initial_digests, "final_digests": final_digests}) + "\n")
    return 0 if len(set(final_digests)) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
