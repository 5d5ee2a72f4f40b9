"""The MLP both TensorFlow peer scripts use (Keras 3), and their thread setting. No toolkit code."""
import keras
import tensorflow as tf


def set_threads(n: int) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)


def mlp(args) -> keras.Model:
    layers = [keras.Input((args.features,))]
    layers += [keras.layers.Dense(args.hidden_size, activation="relu") for _ in range(args.hidden_layers)]
    return keras.Sequential(layers + [keras.layers.Dense(args.classes)])


def batch(args, seed: int):
    g = tf.random.Generator.from_seed(seed)
    return (g.normal((args.batch_size, args.features)),
            g.uniform((args.batch_size,), 0, args.classes, dtype=tf.int64))


def loss_of(model, x, y):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True))
