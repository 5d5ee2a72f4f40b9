"""What `--dataset` means: the built-in datasets as numpy arrays, the on-disk and sharded ones, or
the user's own `load(config)`, with what a built-in model needs to know of them (`Datasets`).

`digits` is the real 8x8 handwritten digits set that scikit-learn ships (1797 images, no
download); `synthetic` is a learnable problem shaped for the model (a linear teacher on vectors,
on pooled images for the ResNets, a fixed next-token rule for the language model). On-disk
datasets (`imagefolder:`, `cifar10:`, `text:`) come from toolkit/data/ondisk.py and the framework's
own image reader; `shards:` from toolkit/data/streams.py. How they are split across ranks:
toolkit/data/sampler.py. numpy is imported lazily.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit import registry
from toolkit.config import IMAGE_MODELS, Config, Dataset, Model, is_reference, on_disk, unset_default
from toolkit.data import ondisk
from toolkit.data.streams import FORMATS, ShardSource, fail, read_index

if TYPE_CHECKING:                       # for annotations only: numpy is imported lazily
    import numpy

SYNTHETIC_IMAGES = (256, 64)    # train, eval samples of synthetic images (and of token windows)


@dataclass(frozen=True)
class Data:
    x_train: numpy.ndarray      # float32 [n, features]
    y_train: numpy.ndarray      # int64 [n]
    x_test: numpy.ndarray
    y_test: numpy.ndarray
    num_classes: int

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])


@dataclass(frozen=True)
class Datasets:
    """What the built-in trainer trains on: `train` and `eval` as numpy (x, y) arrays or the
    framework's datasets, and what a built-in model needs to know of them (None when unknown)."""
    train: Any
    eval: Any
    num_features: int | None
    num_classes: int | None
    input_shape: tuple | None = None    # one sample's shape: (features,), (3, H, W) / (H, W, 3), (context,)


def channels_last(config: Config) -> bool:
    """Images as the framework's convolutions want them: NHWC for TensorFlow, NCHW elsewhere."""
    return config.framework == "tensorflow"


def image_shape(config: Config, size: int) -> tuple:
    return (size, size, 3) if channels_last(config) else (3, size, size)


def datasets(config: Config, session=None) -> Datasets:
    """The built-in dataset, or the user's `load(config)` (config `dataset: pkg.module:load`).
    `session` (the started one, when there is one): what one rank reads for all is shared through it."""
    disk = on_disk(config.dataset)
    if disk:
        return _on_disk(config, *disk, session=session)
    if config.dataset == Dataset.SYNTHETIC.value and config.model in IMAGE_MODELS:
        return synthetic_images(config)
    if config.dataset == Dataset.SYNTHETIC.value and config.model == Model.TRANSFORMER_LM.value:
        return synthetic_tokens(config)
    if config.dataset in {d.value for d in Dataset}:
        data = load(config)
        return Datasets((data.x_train, data.y_train), (data.x_test, data.y_test), data.num_features,
                        data.num_classes, (data.num_features,))
    from toolkit import usercode
    train, evaluation = usercode.load_datasets(config)
    features, classes = _describe(train)
    shape = tuple(train[0].shape[1:]) if is_arrays(train) else None
    return Datasets(train, evaluation, features, classes, shape)


def _on_disk(config: Config, kind: str, path: str, session=None) -> Datasets:
    if kind == "shards":
        return from_shards(config, path)
    if kind == "text":
        train, evaluation = ondisk.text(config.dataset, path, config.context)
        return Datasets(train, evaluation, config.context, ondisk.VOCAB, (config.context,))
    if kind == "cifar10":
        train, evaluation = ondisk.cifar10(config.dataset, path, channels_last(config))
        return Datasets(train, evaluation, 3 * 32 * 32, 10, image_shape(config, 32))
    folder = ondisk.image_folder(config.dataset, path, session)
    reader = registry.reader(config.framework, "images")
    size = config.image_size or unset_default("image_size")
    train, evaluation = reader.read(folder, config, size)
    return Datasets(train, evaluation, 3 * size * size, len(folder.classes), image_shape(config, size))


def from_shards(config: Config, path: str) -> Datasets:
    """`dataset: shards:PATH` for the built-in trainer: the index read, checked against the model and
    the framework; (train, eval) as ShardSources."""
    spec = config.dataset
    index = read_index(spec, path)
    want = FORMATS[config.framework]
    if index.format != want:
        owner = {v: k for k, v in FORMATS.items()}[index.format]
        fail(spec, f"these are {index.format} shards ({owner}'s); {config.framework} reads {want}: write them with "
                   f"`toolkit shards SOURCE OUT --framework {config.framework}`")
    if not is_reference(config.model):
        if index.kind == "tokens" and config.model != Model.TRANSFORMER_LM.value:
            fail(spec, f"these shards hold token sequences: use model transformer_lm (or your own), not {config.model!r}")
        if index.kind == "image" and config.model not in IMAGE_MODELS:
            fail(spec, f"these shards hold images: use model resnet18 or resnet50 (or your own), not {config.model!r}")
    if index.kind == "tokens":
        if config.context != index.context:
            fail(spec, f"these shards hold windows of context {index.context}; set --context {index.context} "
                       "(or write the shards again with another --context)")
        return Datasets(ShardSource(index, True), ShardSource(index, False), index.context, 256, (index.context,))
    if index.image_size and config.image_size and config.image_size != index.image_size:
        fail(spec, f"these shards hold {index.image_size}x{index.image_size} images; drop image_size")
    size = index.image_size or config.image_size or unset_default("image_size")
    return Datasets(ShardSource(index, True), ShardSource(index, False), 3 * size * size, index.num_classes,
                    image_shape(config, size))


def synthetic_images(config: Config, counts=SYNTHETIC_IMAGES) -> Datasets:
    """Random images (the side: image_size, unset 224) labelled by a fixed linear teacher on their
    4x4 average-pooled channels: learnable, the same on every rank, no download."""
    import numpy as np
    size, classes = config.image_size or unset_default("image_size"), 10
    rng = np.random.RandomState(1234)
    teacher = rng.standard_normal((3 * 16, classes)).astype(np.float32)
    out = []
    for n in counts:
        x = rng.standard_normal((n, 3, size, size)).astype(np.float32)
        pooled = x[:, :, : size - size % 4, : size - size % 4].reshape(n, 3, 4, size // 4, 4, size // 4).mean((3, 5))
        y = np.argmax(pooled.reshape(n, -1) @ teacher, axis=1).astype(np.int64)
        out.append((np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if channels_last(config) else x, y))
    return Datasets(out[0], out[1], 3 * size * size, classes, image_shape(config, size))


def synthetic_tokens(config: Config, counts=SYNTHETIC_IMAGES) -> Datasets:
    """Byte-token windows of a fixed rule (the next token is a fixed permutation of the current one,
    one in ten replaced at random): a language model's loss falls on it."""
    import numpy as np
    rng = np.random.RandomState(1234)
    successor = rng.permutation(ondisk.VOCAB)
    out = []
    for n in counts:
        tokens = np.empty((n, config.context + 1), np.int64)
        tokens[:, 0] = rng.randint(0, ondisk.VOCAB, n)
        for t in range(1, config.context + 1):
            noise = rng.rand(n) < 0.1
            tokens[:, t] = np.where(noise, rng.randint(0, ondisk.VOCAB, n), successor[tokens[:, t - 1]])
        out.append((np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])))
    return Datasets(out[0], out[1], config.context, ondisk.VOCAB, (config.context,))


def random_batch(config: Config, n: int, features: int, classes: int, rng):
    """`n` random samples shaped for the config's model, as Horovod's synthetic benchmarks feed it:
    ((x, y), num_features, num_classes, input_shape). Vectors of `features`, images of image_size
    (unset 224), or `context` byte tokens."""
    import numpy as np
    if config.model in IMAGE_MODELS:
        shape = image_shape(config, config.image_size or unset_default("image_size"))
        x = rng.standard_normal((n, *shape)).astype(np.float32)
        return (x, rng.randint(0, classes, n).astype(np.int64)), int(np.prod(shape)), classes, shape
    if config.model == Model.TRANSFORMER_LM.value:
        tokens = rng.randint(0, ondisk.VOCAB, (n, config.context + 1)).astype(np.int64)
        return (tokens[:, :-1].copy(), tokens[:, 1:].copy()), config.context, ondisk.VOCAB, (config.context,)
    x = rng.standard_normal((n, features)).astype(np.float32)
    return (x, rng.randint(0, classes, n).astype(np.int64)), features, classes, (features,)


def _describe(train) -> tuple[int | None, int | None]:
    """(features, classes) of numpy (x, y) arrays, or what a dataset says of itself."""
    import numpy as np
    if isinstance(train, (tuple, list)) and len(train) == 2 and all(isinstance(a, np.ndarray) for a in train):
        x, y = train
        features = int(np.prod(x.shape[1:])) if x.ndim >= 2 else None
        classes = int(y.max()) + 1 if y.size and np.issubdtype(y.dtype, np.integer) else None
        return features, classes
    classes = getattr(train, "num_classes", None)
    if classes is None and hasattr(train, "classes"):
        classes = len(train.classes)
    return None, classes


def is_arrays(data) -> bool:
    """numpy `(x, y)` of equal length: the one data form every session reads without its framework."""
    import numpy as np
    return (isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(a, np.ndarray) for a in data)
            and len(data[0]) == len(data[1]))


def load(config: Config) -> Data:
    import numpy as np

    if config.dataset == Dataset.DIGITS.value:
        pixels, y = ondisk.digits_arrays()
        x = (pixels / 16.0).astype(np.float32)
        classes = 10
    else:
        teacher = np.random.RandomState(1234)
        x = teacher.standard_normal((4096, 64)).astype(np.float32)
        w = teacher.standard_normal((64, 10)).astype(np.float32)
        y = np.argmax(x @ w, axis=1).astype(np.int64)
        classes = 10
    order = np.random.RandomState(0).permutation(len(x))   # fixed split, independent of --seed
    cut = int(len(x) * 0.8)
    train, test = order[:cut], order[cut:]
    return Data(x[train], y[train], x[test], y[test], classes)
