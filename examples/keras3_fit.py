"""Keras 3 `model.fit` on Horovod, the pattern for your own Keras script (the toolkit's trainer
uses a custom step instead; both share adapters/tensorflow.py).

    horovodrun -np 2 --gloo python examples/keras3_fit.py --epochs 10

Ends with one JSON line on rank 0: accuracy, and every rank's initial and final weight digests.
"""
import argparse
import json
import sys

import keras

from adapters.tensorflow import BroadcastCallback, DistributedOptimizer, MetricAverageCallback, build_model
from toolkit import data as datasets
from toolkit.config import Config
from toolkit.trainer import digest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    import horovod.tensorflow as hvd

    hvd.init()
    config = Config(framework="tensorflow")
    data = datasets.load(config)
    keras.utils.set_random_seed(config.seed + hvd.rank())      # different initial weights on purpose
    model = build_model(config, data.num_features, data.num_classes)
    initial = digest(model.get_weights())
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    shard = slice(hvd.rank(), None, hvd.size())                  # this rank's share of the data
    model.fit(data.x_train[shard], data.y_train[shard], batch_size=args.batch_size, epochs=args.epochs,
              shuffle=True, verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[BroadcastCallback(), MetricAverageCallback()])
    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    initial_digests = hvd.allgather_object(initial, name="initial")
    final_digests = hvd.allgather_object(digest(model.get_weights()), name="final")
    if hvd.rank() == 0:
        sys.stdout.write(json.dumps({"world_size": hvd.size(), "accuracy": accuracy,
                                     "initial_digests": initial_digests, "final_digests": final_digests}) + "\n")
    return 0 if len(set(final_digests)) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
