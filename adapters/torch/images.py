"""An image folder's files as toolkit/data/ondisk.py listed them (read as torchvision's `ImageFolder`
would: PIL, converted to RGB): resized to `size`, the usual light augmentation (random crop padded by
1/8 of the side, horizontal flip) on training images when `augment`, ImageNet's normalisation."""
from __future__ import annotations

import torch
from torchvision import transforms as T

from toolkit.data.ondisk import IMAGENET_MEAN, IMAGENET_STD


class Files(torch.utils.data.Dataset):
    """(transform(image), label) of each listed file; a file that cannot be read is the folder's one
    line naming it (the check before training only samples the folder)."""

    def __init__(self, folder, files, labels, transform):
        self.folder, self.files, self.labels, self.transform = folder, files, labels, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image
        path = self.files[i]
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
        except Exception as e:
            raise self.folder.unreadable(path, f"{e.__class__.__name__}: {e}") from None
        return self.transform(image), self.labels[i]


def transform(size: int, augment: bool, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """A PIL RGB image -> float32 [3, size, size]: resized, augmented (a random crop padded by 1/8 of the
    side, a horizontal flip) when `augment`, normalised. An image folder's and shards' images alike."""
    crop_flip = [T.RandomCrop(size, padding=size // 8), T.RandomHorizontalFlip()] if augment else []
    return T.Compose([T.Resize((size, size)), *crop_flip, T.ToTensor(), T.Normalize(mean, std)])


def read(folder, config, size: int):
    """(train, eval) torch Datasets of (image [3, size, size] float32, label)."""
    return (Files(folder, folder.train_files, folder.train_labels, transform(size, config.augment)),
            Files(folder, folder.eval_files, folder.eval_labels, transform(size, False)))
