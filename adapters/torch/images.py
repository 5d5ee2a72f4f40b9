"""An image folder (toolkit/run/ondisk.py checked it) through torchvision's `ImageFolder`: resized to
`size`, the usual light augmentation (random crop padded by 1/8 of the side, horizontal flip) on
training images when `augment`, ImageNet's normalisation."""
from __future__ import annotations

import torch
import torchvision
from torchvision import transforms as T

from toolkit.errors import ToolkitError
from toolkit.run.ondisk import IMAGE_EXTENSIONS, IMAGENET_MEAN, IMAGENET_STD


def read(folder, config, size: int):
    """(train, eval) torch Datasets of (image [3, size, size] float32, label)."""
    normalise = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    augment = [T.RandomCrop(size, padding=size // 8), T.RandomHorizontalFlip()] if config.augment else []
    resize = T.Resize((size, size))

    def load(path):
        from PIL import Image
        try:
            with Image.open(path) as image:
                return image.convert("RGB")
        except Exception as e:
            raise ToolkitError(f"dataset={folder.spec!r}: {path} cannot be read ({e.__class__.__name__}: {e}); "
                               "remove or replace it") from None

    def dataset(root, transforms):
        return torchvision.datasets.ImageFolder(
            str(root), T.Compose([resize, *transforms, *normalise]), loader=load,
            is_valid_file=lambda p: p.lower().endswith(IMAGE_EXTENSIONS))

    train, evaluation = dataset(folder.train_root, augment), dataset(folder.eval_root, [])
    if folder.held_out:
        train = torch.utils.data.Subset(train, list(folder.train_index))
        evaluation = torch.utils.data.Subset(evaluation, list(folder.eval_index))
    return train, evaluation
