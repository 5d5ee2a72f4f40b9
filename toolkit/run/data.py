"""Built-in datasets as numpy arrays, and the one way they are split across ranks.

`digits` is the real 8x8 handwritten digits set that scikit-learn ships (1797 images, no
download); `synthetic` is a learnable problem shaped for the model (a linear teacher on vectors,
on pooled images for the ResNets, a fixed next-token rule for the language model). On-disk
datasets (`imagefolder:`, `cifar10:`, `text:`) come from toolkit/run/ondisk.py and the framework's
own image reader. numpy is imported lazily.
"""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.config import IMAGE_MODELS, Config, Dataset, Model, on_disk, unset_default

SYNTHETIC_IMAGES = (256, 64)    # train, eval samples of synthetic images (and of token windows)


@dataclass(frozen=True)
class Data:
    x_train: "object"   # float32 [n, features]
    y_train: "object"   # int64 [n]
    x_test: "object"
    y_test: "object"
    num_classes: int

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])


@dataclass(frozen=True)
class Datasets:
    """What the built-in trainer trains on: `train` and `eval` as numpy (x, y) arrays or the
    framework's datasets, and what a built-in model needs to know of them (None when unknown)."""
    train: "object"
    eval: "object"
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
    from toolkit.run import ondisk
    if kind == "shards":
        from toolkit.run import streams
        return streams.datasets(config, path, session)
    if kind == "text":
        train, evaluation = ondisk.text(config.dataset, path, config.context)
        return Datasets(train, evaluation, config.context, ondisk.VOCAB, (config.context,))
    if kind == "cifar10":
        train, evaluation = ondisk.cifar10(config.dataset, path, channels_last(config))
        return Datasets(train, evaluation, 3 * 32 * 32, 10, image_shape(config, 32))
    folder = ondisk.image_folder(config.dataset, path, session)
    import importlib
    reader = importlib.import_module(f"toolkit.adapters.{config.framework}.images")
    size = config.image_size or unset_default("image_size")
    train, evaluation = reader.read(folder, config, size)
    return Datasets(train, evaluation, 3 * size * size, len(folder.classes), image_shape(config, size))


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
    from toolkit.run.ondisk import VOCAB
    rng = np.random.RandomState(1234)
    successor = rng.permutation(VOCAB)
    out = []
    for n in counts:
        tokens = np.empty((n, config.context + 1), np.int64)
        tokens[:, 0] = rng.randint(0, VOCAB, n)
        for t in range(1, config.context + 1):
            noise = rng.rand(n) < 0.1
            tokens[:, t] = np.where(noise, rng.randint(0, VOCAB, n), successor[tokens[:, t - 1]])
        out.append((np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])))
    return Datasets(out[0], out[1], config.context, VOCAB, (config.context,))


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
        from toolkit.run.ondisk import VOCAB
        tokens = rng.randint(0, VOCAB, (n, config.context + 1)).astype(np.int64)
        return (tokens[:, :-1].copy(), tokens[:, 1:].copy()), config.context, VOCAB, (config.context,)
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


def arrays_length(data) -> int | None:
    """Samples in numpy data given as columns: a tuple or list of arrays of any arity (`(x, y)` the
    usual) or a dict of them, all of one length; None for anything else (a framework's dataset)."""
    import numpy as np
    columns = list(data.values()) if isinstance(data, dict) else data
    if not isinstance(columns, (tuple, list)) or not columns:
        return None
    if not all(isinstance(a, np.ndarray) and a.ndim for a in columns):
        return None
    n = len(columns[0])
    return n if all(len(a) == n for a in columns) else None


def map_structure(fn, batch):
    """`fn` on every leaf of a batch (tuples, lists and dicts kept, nested ones too)."""
    if isinstance(batch, dict):
        return {k: map_structure(fn, v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_structure(fn, v) for v in batch)
    return fn(batch)


def leading_size(batch) -> int:
    """Samples in a batch: the first leaf's leading dimension."""
    while isinstance(batch, (dict, tuple, list)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return int(batch.shape[0])


def is_arrays(data) -> bool:
    """numpy `(x, y)` of equal length: the one data form every session reads without its framework."""
    import numpy as np
    return (isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(a, np.ndarray) for a in data)
            and len(data[0]) == len(data[1]))


def load(config: Config) -> Data:
    import numpy as np

    if config.dataset == Dataset.DIGITS.value:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.data / 16.0).astype(np.float32)
        y = bunch.target.astype(np.int64)
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


def epoch_order(n: int, epoch: int, seed: int):
    """The epoch's global permutation of the training samples, the same on every rank."""
    import numpy as np

    return np.random.RandomState(seed + 1_000_003 * (epoch + 1)).permutation(n)


def epoch_shard(n: int, epoch: int, seed: int, rank: int, size: int):
    """Indices of this rank's training samples for `epoch`.

    One global permutation per epoch (same on every rank), cut to a multiple of `size`, then
    strided: rank r takes positions r, r+size, ... So micro-batch j of step s on all ranks
    together is one contiguous block of the global permutation, and `size` ranks x
    `accumulation_steps` k x batch b see exactly the samples 1 rank x batch size*k*b sees.
    """
    order = epoch_order(n, epoch, seed)
    return order[: n - n % size][rank::size]


def step_indices(order, position: int, batch_size: int, accumulation_steps: int, size: int, replicas):
    """The micro-batches of one optimizer step starting at `position` of the epoch's `order`.

    Micro-batch j is the block order[position + j*b*size : position + (j+1)*b*size]; replica r takes
    every size-th sample of it from r on (the same samples `epoch_shard` gives rank r when
    position is a multiple of b*k*size). Progress is a position in the permutation, so the
    epoch carries on without repeating or skipping a sample when `size` changes (elastic training).
    Each micro-batch holds the replicas' samples one after the other.
    """
    import numpy as np

    b, k = batch_size, accumulation_steps
    blocks = (order[position + j * b * size: position + (j + 1) * b * size] for j in range(k))
    return [np.concatenate([block[r::size] for r in replicas]) for block in blocks]


def steps_left(n: int, position: int, size: int, batch_size: int, accumulation_steps: int) -> int:
    """Full optimizer steps of `size` replicas that still fit in the epoch after `position`."""
    return (n - position) // (batch_size * accumulation_steps * size)


def steps_per_epoch(n: int, size: int, batch_size: int, accumulation_steps: int) -> int:
    return (n // size) // (batch_size * accumulation_steps)


class Sampler:
    """Which samples this process's replicas take, optimizer step by optimizer step: the one sampling
    rule of the toolkit, behind every framework's `session.loader` (numpy, torch `Dataset`, Gluon
    `Dataset`; tf.data follows it with shuffle/shard/skip).

    Training: one permutation of the `n` samples per epoch (from `seed` and the epoch only, the
    same on every rank), taken `batch_size x accumulation_steps x world` positions per optimizer
    step (`step_indices`); the last partial step is dropped, so every replica runs the same number
    of steps. Progress is a position in that permutation (`state_dict`), so a resume or an elastic
    resize (`resize`) carries on without repeating or skipping a sample. Evaluation
    (`train=False`): the samples in order, replica r taking every `world`-th from r, nothing dropped.
    `shuffle=False` trains on the samples in their order, every epoch.
    """

    def __init__(self, n: int, batch_size: int, accumulation_steps: int = 1, world: int = 1,
                 replicas: range | None = None, seed: int = 0, train: bool = True, shuffle: bool = True):
        if n < 1:
            from toolkit.errors import ToolkitError
            raise ToolkitError("the dataset is empty: give the loader at least one sample")
        self.n, self.batch_size, self.k, self.seed = n, batch_size, accumulation_steps, seed
        self.train, self.shuffle = train, shuffle
        self.epoch, self.position = 0, 0
        self.resize(world, replicas if replicas is not None else range(1))

    def resize(self, world: int, replicas: range) -> None:
        """A new world (elastic training); the position in the epoch stays."""
        self.world, self.replicas = world, replicas

    @property
    def step_samples(self) -> int:
        return self.batch_size * self.k * self.world

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in a whole epoch (training), or batches of this replica (evaluation)."""
        if self.train:
            return self.n // self.step_samples
        share = len(range(self.replicas.start, self.n, self.world))
        return -(-share // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning (a resumed position is kept for the epoch it belongs to)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def order(self):
        import numpy as np
        return epoch_order(self.n, self.epoch, self.seed) if self.train and self.shuffle else np.arange(self.n)

    def remaining(self) -> list:
        """Each remaining optimizer step of the epoch: its `accumulation_steps` micro-batches of
        indices (each micro-batch holds this process's replicas' samples one after the other).
        Evaluation: this replica's batches, one micro-batch a step. The position does not move."""
        import numpy as np
        order = self.order()
        if not self.train:
            mine = np.concatenate([order[r::self.world] for r in self.replicas])
            return [[mine[start:start + self.batch_size]] for start in range(0, len(mine), self.batch_size)]
        out, position = [], self.position
        while steps_left(self.n, position, self.world, self.batch_size, self.k):
            out.append(step_indices(order, position, self.batch_size, self.k, self.world, self.replicas))
            position += self.step_samples
        return out

    def advance(self) -> None:
        """One optimizer step of the epoch handed out (training)."""
        if self.train:
            self.position += self.step_samples

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
