"""Your Keras 3 (TensorFlow) training script with a custom loop, made data-parallel: the lines
marked `# toolkit` are the only changes to the single-process script it was. (With `model.fit`:
`model.compile(optimizer=session.fit_optimizer(), ...)` and `model.fit(..., callbacks=
session.fit_callbacks())`, see examples/keras_fit.py.)

    python examples/your_keras.py                                 # one process, as before
    horovodrun -np 2 --gloo python examples/your_keras.py         # two ranks (or toolkit launch, mpirun)
"""
import json
import sys

import toolkit  # toolkit


def main(epochs: int = 10) -> int:
    session = toolkit.start(framework="tensorflow")  # toolkit: hvd.init, one GPU per rank, seeds
    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16).astype("float32"), digits.target
    train = tf.data.Dataset.from_tensor_slices((x[:1400], y[:1400]))
    test = tf.data.Dataset.from_tensor_slices((x[1400:], y[1400:]))
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128), keras.layers.BatchNormalization(),
                              keras.layers.ReLU(), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model, optimizer = session.setup(model, optimizer)                                  # toolkit
    loader = session.loader(train, batch_size=32)    # toolkit: was train.shuffle(1400).batch(32)
    for epoch in range(epochs):
        loader.set_epoch(epoch)                                                         # toolkit
        for inputs, labels in loader:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(inputs, training=True))
            session.backward(loss, tape)    # toolkit: was grads = tape.gradient(loss, model.trainable_variables)
            session.step()                  # toolkit: was optimizer.apply(grads, model.trainable_variables)
    test_loss, accuracy = session.evaluate(session.loader(test, train=False))          # toolkit
    digests = session.check_replicas()      # toolkit: every rank holds the same model
    if session.is_main:                                                                 # toolkit
        print(json.dumps({"framework": "tensorflow", "world_size": session.size, "accuracy": accuracy,
                          "test_loss": test_loss, "final_digests": digests}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
