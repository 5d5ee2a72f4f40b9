"""Keras `model.fit` on Horovod, the pattern for your own Keras script: Keras 3 with the toolkit's
pieces (horovod.tensorflow.keras fails on Keras 3), or legacy tf-keras with Horovod's own, handed
out by the same session (`session.fit_optimizer()`, `session.fit_callbacks()`). `session.setup` first makes
the model and optimizer the session's, so its verbs (check_replicas, evaluate, save) see what fit trains;
the callbacks keep every rank's batch-norm statistics equal (averaged at each epoch's end).

    horovodrun -np 2 --gloo python examples/keras_fit.py --epochs 10                  # Keras 3
    horovodrun -np 2 --gloo python examples/keras_fit.py --keras tf_keras --epochs 10  # tf-keras

(The toolkit's trainer uses its custom step instead: session.train_step.)
Ends with one JSON line on rank 0: accuracy, and every rank's initial and final weight digests.
"""
import argparse
import json
import sys

import toolkit
from toolkit.adapters.base import digest
from toolkit.data import datasets


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

    session = toolkit.start(framework="tensorflow", keras=args.keras, lr=args.lr, momentum=0.9)
    keras = session.keras                      # keras, or tf_keras for the legacy path
    keras.mixed_precision.set_global_policy(args.precision)
    data = datasets.load(session.config)
    model = session.builtin_model(data.num_features, data.num_classes)   # rank r: seed + r, different
    initial = digest(model.get_weights())
    model, optimizer = session.setup(model)                              # rank 0's weights on every rank
    model.compile(optimizer=session.fit_optimizer(optimizer), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    shard = slice(session.rank, None, session.size)                      # this rank's share of the data
    model.fit(data.x_train[shard], data.y_train[shard], batch_size=args.batch_size, epochs=args.epochs,
              shuffle=True, verbose=2 if session.is_main else 0, callbacks=session.fit_callbacks())
    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    initial_digests = session.allgather_object(initial, name="initial")
    final_digests = session.allgather_object(digest(model.get_weights()), name="final")
    session.check_replicas()            # exits on every rank if the replicas differ
    if session.is_main:
        sys.stdout.write(json.dumps({"world_size": session.size, "keras": args.keras, "precision": args.precision,
                                     "accuracy": accuracy,
                                     "initial_digests": initial_digests, "final_digests": final_digests}) + "\n")
    return 0 if len(set(final_digests)) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
