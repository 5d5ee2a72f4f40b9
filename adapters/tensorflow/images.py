"""An image folder's files as toolkit/data/ondisk.py listed them, read as
`keras.utils.image_dataset_from_directory` reads them (`decode_image` to RGB, bilinear `resize` to
`size`, int32 labels), the usual light augmentation (random crop padded by 1/8 of the side,
horizontal flip) on training images when `augment`, ImageNet's normalisation. A folder of class
folders only is split by ondisk.py's fixed held-out files (the same files as torch and MXNet hold out)."""
from __future__ import annotations

import tensorflow as tf

from toolkit.adapters.tensorflow.data import error_line
from toolkit.data.ondisk import IMAGENET_MEAN, IMAGENET_STD, MAGIC


def crop_flip(x, size: int):
    """The light augmentation: a random crop of the image padded by 1/8 of the side, a horizontal flip
    (an image folder's and shards' images alike)."""
    pad = size // 8
    x = tf.image.resize_with_crop_or_pad(x, size + 2 * pad, size + 2 * pad)
    return tf.image.random_flip_left_right(tf.image.random_crop(x, (size, size, 3)))


def normalised(x, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """A float image in 0-255 normalised by the per-channel mean and std (given in 0-1)."""
    return (x - tf.constant(mean) * 255.0) / (tf.constant(std) * 255.0)


def read(folder, config, size: int):
    """(train, eval) unbatched tf.data.Datasets of (image [size, size, 3] float32, int32 label)."""
    # ondisk.py's line for an unreadable file, its path filled in the graph
    before, after = str(folder.unreadable("\0", "no PNG or JPEG signature in its first bytes")).split("\0")

    def load(path, label):
        raw = tf.io.read_file(path)
        image_file = tf.reduce_any([tf.equal(tf.strings.substr(raw, 0, len(m)), m) for m in MAGIC])
        # decode_image's own error names no file: a file that is not a PNG or JPEG is named here
        with tf.control_dependencies([tf.debugging.Assert(image_file, [error_line(before, path, after)])]):
            image = tf.io.decode_image(raw, channels=3, expand_animations=False)
        image = tf.image.resize(image, (size, size), method="bilinear")
        image.set_shape((size, size, 3))
        return image, label

    def normalise(x, y):
        return normalised(x), y

    def augment(x, y):
        return crop_flip(x, size), y

    def dataset(files, labels, train: bool):
        ds = (tf.data.Dataset.from_tensor_slices((list(files), tf.constant(labels, tf.int32)))
              .map(load, num_parallel_calls=tf.data.AUTOTUNE)
              .apply(tf.data.experimental.assert_cardinality(len(files))))
        if train and config.augment:
            ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.map(normalise, num_parallel_calls=tf.data.AUTOTUNE)

    return (dataset(folder.train_files, folder.train_labels, True),
            dataset(folder.eval_files, folder.eval_labels, False))
