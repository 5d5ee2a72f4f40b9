"""An image folder (toolkit/run/ondisk.py checked it) through Gluon's `ImageFolderDataset`: resized to
`size`, the usual light augmentation (random crop padded by 1/8 of the side, horizontal flip) on
training images when `augment`, ImageNet's normalisation."""
from __future__ import annotations

import mxnet as mx
from mxnet import gluon
from mxnet.gluon.data.vision import transforms as T

from toolkit.run.ondisk import IMAGENET_MEAN, IMAGENET_STD


class _Subset(gluon.data.Dataset):
    """The samples of `base` at `index` (toolkit/run/ondisk.py's held-out split)."""

    def __init__(self, base, index):
        self.base, self.index = base, list(index)

    def __getitem__(self, i):
        return self.base[self.index[i]]

    def __len__(self):
        return len(self.index)


def read(folder, config, size: int):
    """(train, eval) Gluon Datasets of (image [3, size, size] float32, label)."""
    pad = size // 8

    def padded_crop(image):     # Gluon 1.9's transforms have no padded RandomCrop
        image = mx.image.copyMakeBorder(image, pad, pad, pad, pad)
        return mx.image.random_crop(image, (size, size))[0]

    normalise = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    augment = [padded_crop, T.RandomFlipLeftRight()] if config.augment else []

    def dataset(root, index, transforms):
        ds = gluon.data.vision.ImageFolderDataset(str(root), flag=1)
        ds = _Subset(ds, index) if index is not None else ds
        return ds.transform_first(T.Compose([T.Resize((size, size)), *transforms, *normalise]))

    return (dataset(folder.train_root, folder.train_index, augment),
            dataset(folder.eval_root, folder.eval_index, []))
