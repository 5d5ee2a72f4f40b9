"""An image folder's files as toolkit/data/ondisk.py listed them, read as Gluon's `ImageFolderDataset`
reads them (`mx.image.imread`, RGB): resized to `size`, the usual light augmentation (random crop
padded by 1/8 of the side, horizontal flip) on training images when `augment`, ImageNet's normalisation."""
from __future__ import annotations

import mxnet as mx
from mxnet import gluon
from mxnet.gluon.data.vision import transforms as T

from toolkit.data.ondisk import IMAGENET_MEAN, IMAGENET_STD


class Files(gluon.data.Dataset):
    """(image [H, W, 3] uint8, label) of each listed file; a file that cannot be read is the folder's
    one line naming it (the check before training only samples the folder)."""

    def __init__(self, folder, files, labels):
        self.folder, self.files, self.labels = folder, files, labels

    def __getitem__(self, i):
        path = self.files[i]
        try:
            return mx.image.imread(path, flag=1), self.labels[i]
        except Exception as e:      # MXNetError's message is a C++ traceback: its last line says why
            why = (str(e).strip().splitlines() or [""])[-1]
            name = e.__class__.__name__
            raise self.folder.unreadable(path, why if why.startswith(name) else f"{name}: {why}") from None

    def __len__(self):
        return len(self.files)


def transform(size: int, augment: bool, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """An image NDArray [H, W, 3] uint8 -> float32 [3, size, size]: resized, augmented (a random crop
    padded by 1/8 of the side, a horizontal flip) when `augment`, normalised. An image folder's and
    shards' images alike."""
    pad = size // 8

    def padded_crop(image):     # Gluon 1.9's transforms have no padded RandomCrop
        image = mx.image.copyMakeBorder(image, pad, pad, pad, pad)
        return mx.image.random_crop(image, (size, size))[0]

    crop_flip = [padded_crop, T.RandomFlipLeftRight()] if augment else []
    return T.Compose([T.Resize((size, size)), *crop_flip, T.ToTensor(), T.Normalize(mean, std)])


def read(folder, config, size: int):
    """(train, eval) Gluon Datasets of (image [3, size, size] float32, label)."""
    return (Files(folder, folder.train_files, folder.train_labels).transform_first(transform(size, config.augment)),
            Files(folder, folder.eval_files, folder.eval_labels).transform_first(transform(size, False)))
