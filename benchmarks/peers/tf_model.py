"""The MLP both TensorFlow peer scripts use (Keras 3), and their thread setting. No toolkit code."""
import keras
import tensorflow as tf


def set_threads(n: int) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)


def mlp(args) -> keras.Model:
    """The MLP, or keras.applications' ResNet-50 (`--model resnet50`, weights=None)."""
    if args.model == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(args.image_size, args.image_size, 3),
                                           classes=args.classes, classifier_activation=None)
    layers = [keras.Input((args.features,))]
    layers += [keras.layers.Dense(args.hidden_size, activation="relu") for _ in range(args.hidden_layers)]
    return keras.Sequential(layers + [keras.layers.Dense(args.classes)])


def batch(args, seed: int):
    g = tf.random.Generator.from_seed(seed)
    shape = (args.features,) if args.model == "mlp" else (args.image_size, args.image_size, 3)
    return (g.normal((args.batch_size, *shape)),
            g.uniform((args.batch_size,), 0, args.classes, dtype=tf.int64))


def loss_of(model, x, y):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True))
