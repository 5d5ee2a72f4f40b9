"""An image folder (toolkit/run/ondisk.py checked it) through `keras.utils.image_dataset_from_directory`:
resized to `size`, the usual light augmentation (random crop padded by 1/8 of the side, horizontal
flip) on training images when `augment`, ImageNet's normalisation. A folder of class folders only is
split by toolkit/run/ondisk.py's fixed held-out files (the same files as torch and MXNet hold out)."""
from __future__ import annotations

import keras
import tensorflow as tf

from toolkit.run.ondisk import IMAGENET_MEAN, IMAGENET_STD


def read(folder, config, size: int):
    """(train, eval) unbatched tf.data.Datasets of (image [size, size, 3] float32, int label)."""
    mean, std = tf.constant(IMAGENET_MEAN) * 255.0, tf.constant(IMAGENET_STD) * 255.0
    pad = size // 8

    def normalise(x, y):
        return (x - mean) / std, y

    def augment(x, y):
        x = tf.image.resize_with_crop_or_pad(x, size + 2 * pad, size + 2 * pad)
        return tf.image.random_flip_left_right(tf.image.random_crop(x, (size, size, 3))), y

    def dataset(root, index, train: bool):
        ds = keras.utils.image_dataset_from_directory(
            str(root), labels="inferred", label_mode="int", class_names=list(folder.classes), batch_size=None,
            image_size=(size, size), shuffle=False, verbose=False)
        if index is not None:       # the sorted files' positions ondisk.py holds out (or keeps)
            keep = tf.constant(index, tf.int64)
            ds = (ds.enumerate().filter(lambda i, sample: tf.reduce_any(tf.equal(i, keep)))
                  .map(lambda i, sample: sample)
                  .apply(tf.data.experimental.assert_cardinality(len(index))))
        if train and config.augment:
            ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.map(normalise, num_parallel_calls=tf.data.AUTOTUNE)

    return (dataset(folder.train_root, folder.train_index, True),
            dataset(folder.eval_root, folder.eval_index, False))
