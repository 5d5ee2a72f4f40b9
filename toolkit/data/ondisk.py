"""Datasets on disk, named by the config as `KIND:PATH`: `imagefolder:PATH`, `cifar10:PATH`, `text:PATH`.

Framework-free: the path is checked here, once, so missing or malformed data is one line naming
the path, whatever the framework. An image folder is listed here by rank 0 alone (one os.scandir a
folder, no stat or read of each file) and the list shared with the other ranks; the first bytes
of a fixed sample of SAMPLE files are checked before training, and a bad file outside the sample is
one line naming it when the framework's reader reaches it. The readers (adapters/<framework>/images.py:
PIL as torchvision's `ImageFolder` reads, `tf.io.decode_image` as `keras.utils.image_dataset_from_directory`
does, `mx.image.imread` as Gluon's `ImageFolderDataset` does) read the `ImageFolder`'s file lists and list
nothing again: 200,000 files cost one listing, not one per rank and framework plus a read of every file.
CIFAR-10's python batches and a text corpus are read into numpy here: the frameworks' CIFAR-10
classes check the official files' hashes and download on a mismatch, and a byte-level corpus needs
no reader.

Image folder layouts (ImageNet's): `PATH/train/<class>/*.png|jpg` with `PATH/val/<class>/...`; or
`PATH/<class>/...` alone, of which a fixed HELD_OUT fraction (the same files on every rank and every
run) is the evaluation set.
"""
from __future__ import annotations

import os
import pickle
import random
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ToolkitError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")     # what all three frameworks' folder readers read
MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")  # PNG, JPEG
SAMPLE = 64              # files whose first bytes are checked before training (_check_sample)
HELD_OUT = 0.2           # a folder of class folders only: this fraction of its images is evaluated
TEXT_HELD_OUT = 0.1      # the last tenth of a corpus is evaluated
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
VOCAB = 256              # byte-level tokens


@dataclass(frozen=True)
class ImageFolder:
    """An image folder, listed and checked once: its train and evaluation files (paths) with their labels
    (positions in `classes`), which the frameworks' readers read as they are, listing nothing again."""
    spec: str                       # the config's value, for error lines
    classes: tuple[str, ...]
    train_files: tuple[str, ...]
    train_labels: tuple[int, ...]
    eval_files: tuple[str, ...]
    eval_labels: tuple[int, ...]
    train_index: tuple[int, ...] | None = None   # HELD_OUT split: positions in the folder's sorted file list
    eval_index: tuple[int, ...] | None = None

    @property
    def held_out(self) -> bool:
        return self.train_index is not None

    def unreadable(self, path, why: str) -> ToolkitError:
        """The reader's line for a file that fails when read (the check before training samples SAMPLE)."""
        return ToolkitError(f"dataset={self.spec!r}: {path} cannot be read ({why}); remove or replace it")


def _fail(spec: str, why: str) -> None:
    raise ToolkitError(f"dataset={spec!r}: {why}")


def image_folder(spec: str, path: str, session=None) -> ImageFolder:
    """The folder listed by rank 0 alone and shared with the other ranks (`session`, the started
    one): a folder of 200,000 files is listed once, not once per rank, and every rank gets the
    same lists. A bad folder stops every rank with rank 0's line. Under elastic training there is no
    collective before hvd.elastic.run, so each rank lists it."""
    if session is None or session.size == 1 or session.config.elastic:
        return _list(spec, path)
    listed: ImageFolder | str | None = None
    if session.is_main:
        try:
            listed = _list(spec, path)
        except ToolkitError as e:
            listed = str(e)
    listed = session.broadcast_object(listed, name="toolkit.imagefolder")
    if isinstance(listed, str):
        raise ToolkitError(listed)
    return listed


def _list(spec: str, path: str) -> ImageFolder:
    root = Path(path)
    if not root.is_dir():
        _fail(spec, f"no folder {root}; give a folder of class folders (PATH/<class>/*.png) or ImageNet's layout "
                    "(PATH/train/<class>/..., PATH/val/<class>/...)")
    if (root / "train").is_dir():
        if not (root / "val").is_dir():
            _fail(spec, f"{root}/train has no {root}/val beside it; add the evaluation images there "
                        "(PATH/val/<class>/...), or give a folder of class folders only")
        classes, files, labels = _scan(spec, root / "train")
        val_classes, val_files, val_labels = _scan(spec, root / "val")
        if val_classes != classes:
            _fail(spec, f"{root}/val's class folders ({', '.join(val_classes)}) differ from {root}/train's "
                        f"({', '.join(classes)}); give both the same classes")
        _check_sample(spec, files + val_files)
        return ImageFolder(spec, classes, tuple(files), tuple(labels), tuple(val_files), tuple(val_labels))
    classes, files, labels = _scan(spec, root)
    if len(files) < 2:
        _fail(spec, f"{root} holds {len(files)} image; at least 2 are needed to hold {HELD_OUT:.0%} out for "
                    "evaluation")
    _check_sample(spec, files)
    import numpy as np
    order = np.random.RandomState(0).permutation(len(files))    # fixed: independent of --seed
    cut = max(1, int(round(len(files) * HELD_OUT)))
    train, held = tuple(sorted(order[cut:].tolist())), tuple(sorted(order[:cut].tolist()))
    return ImageFolder(spec, classes, tuple(files[i] for i in train), tuple(labels[i] for i in train),
                       tuple(files[i] for i in held), tuple(labels[i] for i in held), train, held)


def _scan(spec: str, root: Path) -> tuple[tuple[str, ...], list[str], list[int]]:
    """(classes, files, labels) in the order the frameworks' own folder readers use: class folders
    sorted, files sorted within each. One os.scandir per folder and no stat or read of a file."""
    classes = tuple(sorted(entry.name for entry in os.scandir(root) if entry.is_dir()))
    if not classes:
        _fail(spec, f"{root} has no class folders; put the images in one folder per class "
                    f"({root}/<class>/*.png|jpg)")
    files, labels = [], []
    for label, name in enumerate(classes):
        entries = list(os.scandir(root / name))
        nested = next((e.name for e in entries if e.is_dir()), None)
        if nested:      # torchvision and Keras would read it, Gluon would not: refused, so a folder means one thing
            _fail(spec, f"{root / name / nested} is a folder inside a class folder; move its images up into "
                        f"{root / name} or remove it (the frameworks' readers disagree on nested folders)")
        mine = sorted(e.path for e in entries
                      if os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS and e.is_file())
        if not mine:
            _fail(spec, f"{root / name} has no .png/.jpg images; remove the folder or add its images")
        files += mine
        labels += [label] * len(mine)
    return classes, files, labels


def _check_sample(spec: str, files: list[str]) -> None:
    """The first bytes of SAMPLE files (all of a small folder; a fixed sample of a large one): a folder
    of the wrong files is one line before training, without opening 200,000 files first. A bad file
    outside the sample is named by the reader that reaches it (ImageFolder.unreadable)."""
    for f in files if len(files) <= SAMPLE else random.Random(0).sample(files, SAMPLE):
        try:
            with open(f, "rb") as handle:
                head = handle.read(8)
        except OSError as e:
            _fail(spec, f"{f} cannot be read ({e.strerror}); remove or replace it")
        if not any(head.startswith(m) for m in MAGIC):
            _fail(spec, f"{f} is not a PNG or JPEG image (unreadable); remove or replace it")


def cifar10(spec: str, path: str, channels_last: bool):
    """CIFAR-10's python batches (cifar-10-python.tar.gz unpacked) -> normalised float32
    ((x_train, y_train), (x_test, y_test)), NCHW (or NHWC), int64 labels."""
    import numpy as np
    mean, std = np.array(CIFAR_MEAN, np.float32), np.array(CIFAR_STD, np.float32)

    def normalised(x, y):
        x = (x.astype(np.float32) / 255.0 - mean) / std
        return np.ascontiguousarray(x if channels_last else x.transpose(0, 3, 1, 2)), y

    train, test = cifar10_pixels(spec, path)
    return normalised(*train), normalised(*test)


def cifar10_pixels(spec: str, path: str):
    """CIFAR-10's python batches, checked -> ((x_train, y_train), (x_test, y_test)): uint8 [N, 32, 32, 3]
    pixels as stored (`toolkit shards` writes them as PNG) and int64 labels."""
    import numpy as np
    root = Path(path)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    if not root.is_dir():
        _fail(spec, f"no folder {root}; give the folder of CIFAR-10's python batches (data_batch_1..5, test_batch)")
    missing = [n for n in CIFAR_TRAIN + ("test_batch",) if not (root / n).is_file()]
    if missing:
        _fail(spec, f"{root} lacks {', '.join(missing)}; expected CIFAR-10's python format (data_batch_1..5 and "
                    "test_batch, as cifar-10-python.tar.gz unpacks)")

    def read(names):
        xs, ys = [], []
        for n in names:
            try:
                with open(root / n, "rb") as f:
                    batch = pickle.load(f, encoding="bytes")
                x = np.asarray(batch[b"data"], np.uint8)
                y = np.asarray(batch[b"labels"], np.int64)
                if x.ndim != 2 or x.shape[1] != 3072 or len(y) != len(x) or y.min() < 0 or y.max() > 9:
                    raise ValueError("shape")
            except Exception:
                _fail(spec, f"{root / n} is not a CIFAR-10 batch (expected a pickle with b'data': uint8 [N, 3072] "
                            "and b'labels': N labels 0-9); replace it with the original file")
            xs.append(x)
            ys.append(y)
        return np.ascontiguousarray(np.concatenate(xs).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)), np.concatenate(ys)

    return read(CIFAR_TRAIN), read(("test_batch",))


def text(spec: str, path: str, context: int):
    """A text file as byte tokens: non-overlapping windows of `context + 1` bytes, x the first
    `context`, y the next token at each position (int64). The last TEXT_HELD_OUT is evaluated."""
    import numpy as np
    f = Path(path)
    if not f.is_file():
        _fail(spec, f"no file {f}; give a plain text file (its bytes are the tokens)")
    tokens = np.frombuffer(f.read_bytes(), np.uint8).astype(np.int64)
    window = context + 1
    cut = int(len(tokens) * (1 - TEXT_HELD_OUT))
    if cut // window < 1 or (len(tokens) - cut) // window < 1:
        _fail(spec, f"{f} has {len(tokens)} bytes; context={context} needs at least {-(-window // TEXT_HELD_OUT)} "
                    "(a window of context + 1 bytes held out, ten times as much in all); lower --context or add text")

    def windows(part):
        n = len(part) // window
        w = part[: n * window].reshape(n, window)
        return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])

    return windows(tokens[:cut]), windows(tokens[cut:])


def digits_arrays():
    """scikit-learn's digits: (pixels float64 [1797, 64] in 0..16, labels int64 [1797]), what
    `sklearn.datasets.load_digits()` returns as `data` and `target`. Read from the file scikit-learn
    ships without importing scikit-learn (its import costs ~2 s of CPU in every process that trains on
    digits); `load_digits()` where that file is not where scikit-learn keeps it."""
    import importlib.util

    import numpy as np
    spec = importlib.util.find_spec("sklearn")
    shipped = Path((spec.submodule_search_locations or [""])[0] if spec else "") / "datasets" / "data" / "digits.csv.gz"
    if spec and shipped.is_file():
        table = np.loadtxt(shipped, delimiter=",")
        return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits
    bunch = load_digits()
    return bunch.data, bunch.target.astype(np.int64)


def digits_folder(root: Path, per_class: int | None = None, layout: str = "classes") -> Path:
    """scikit-learn's digits as 8x8 grayscale PNGs, an image folder made without a download:
    `root/<digit>/<i>.png` ("classes": the reader holds a fixed fraction out) or `root/train/<digit>/...`
    and `root/val/<digit>/...` ("train_val", every fifth image of a class in val). `per_class` keeps
    the first N of each class. examples/digits_images.py is its command line."""
    import numpy as np
    from PIL import Image
    pixels, labels = digits_arrays()
    counts: dict = {}
    for i, (image, label) in enumerate(zip(pixels.reshape(-1, 8, 8), labels)):
        counts[label] = counts.get(label, 0) + 1
        if per_class is not None and counts[label] > per_class:
            continue
        split = "" if layout == "classes" else ("val" if counts[label] % 5 == 0 else "train")
        folder = Path(root) / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * 255 / 16).astype(np.uint8), mode="L").save(folder / f"{i}.png")
    return Path(root)
