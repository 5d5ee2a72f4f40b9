"""`toolkit shards SOURCE OUT --framework F`: a dataset the config can name (`imagefolder:PATH`,
`cifar10:PATH`, `text:PATH`) written as that framework's shards (adapters/<framework>/shards.py:
tar for torch, TFRecord for TensorFlow, RecordIO for MXNet) with the index beside them
(toolkit/data/streams.py reads it). The evaluation split keeps its own shards (`eval-*`).

Training samples are written in a fixed shuffled order (the same every time), so each shard holds
every class in proportion and an epoch's shard permutation plus a window shuffle mixes well; each
sample's id is its position in the source's own order (the image folder's sorted files, CIFAR-10's
batches, the corpus's windows), per split. Images are stored as encoded bytes (an image folder's
files as they are; CIFAR-10's pixels as PNG) and decoded at read time as `imagefolder:` decodes.
"""
from __future__ import annotations

import io
import shutil
from pathlib import Path

from toolkit import messages, registry
from toolkit.config import on_disk
from toolkit.data import ondisk, streams
from toolkit.errors import ToolkitError

SHARD_SIZE = 10_000      # samples per shard by default
SOURCES = ("imagefolder", "cifar10", "text")


def _png(pixels) -> bytes:
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _image_folder(spec, path):
    folder = ondisk.image_folder(spec, path)

    def split(files, labels):
        for i, (f, label) in enumerate(zip(files, labels)):
            yield i, int(label), lambda f=f: Path(f).read_bytes(), Path(f).suffix.lower().lstrip(".")

    return (dict(kind="image", num_classes=len(folder.classes), classes=list(folder.classes),
                 mean=list(ondisk.IMAGENET_MEAN), std=list(ondisk.IMAGENET_STD)),
            list(split(folder.train_files, folder.train_labels)), list(split(folder.eval_files, folder.eval_labels)))


def _cifar10(spec, path):
    (x_train, y_train), (x_test, y_test) = ondisk.cifar10_pixels(spec, path)

    def split(x, y):
        return [(i, int(label), lambda p=x[i]: _png(p), "png") for i, label in enumerate(y)]

    return (dict(kind="image", num_classes=10, mean=list(ondisk.CIFAR_MEAN), std=list(ondisk.CIFAR_STD),
                 image_size=32), split(x_train, y_train), split(x_test, y_test))


def _text(spec, path, context):
    (x_train, y_train), (x_test, y_test) = ondisk.text(spec, path, context)

    def split(x, y):
        import numpy as np
        windows = np.concatenate([x, y[:, -1:]], axis=1).astype(np.uint8)
        return [(i, 0, lambda w=w: w.tobytes(), "bin") for i, w in enumerate(windows)]

    return dict(kind="tokens", context=context), split(x_train, y_train), split(x_test, y_test)


def write(source: str, out: str, framework: str, shard_size: int = SHARD_SIZE, context: int = 64,
          say=print) -> Path:
    """Writes the shards and their index; returns the index's path."""
    disk = on_disk(source)
    if not disk or disk[0] not in SOURCES or not disk[1]:
        raise ToolkitError(f"toolkit shards {source}: SOURCE is imagefolder:PATH, cifar10:PATH or text:PATH")
    if framework not in streams.FORMATS:
        raise ToolkitError(f"toolkit shards --framework {framework}: give torch, tensorflow or mxnet")
    if shard_size < 1:
        raise ToolkitError(f"toolkit shards --shard-size {shard_size}: give a positive number of samples per shard")
    kind, path = disk
    meta, train, evaluation = (_text(source, path, context) if kind == "text" else
                               _cifar10(source, path) if kind == "cifar10" else _image_folder(source, path))
    root = Path(out)
    if root.exists() and any(root.iterdir()) and not (root / streams.INDEX).is_file():
        raise ToolkitError(f"toolkit shards: {root} exists and holds other files; give an empty or new folder")
    tmp = root.parent / f".{root.name}.writing"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fmt = streams.FORMATS[framework]
    writer_cls = registry.reader(framework, "shards").Writer
    import numpy as np
    order = np.random.RandomState(0).permutation(len(train))
    splits = {}
    bar = messages.bar(len(train) + len(evaluation), "toolkit shards", "sample")    # a terminal's only
    for name, samples in (("train", [train[i] for i in order]), ("eval", evaluation)):
        files: list = []
        for start in range(0, len(samples), shard_size):
            file = f"{name}-{len(files):06d}{streams.SUFFIX[fmt]}"
            writer = writer_cls(tmp / file)
            part = samples[start:start + shard_size]
            for sample_id, label, payload, ext in part:
                writer.write(sample_id, label, payload(), ext)
                if bar is not None:
                    bar.update(1)
            writer.close()
            files.append((file, len(part)))
        splits[name] = files
    if bar is not None:
        bar.close()
    index = streams.write_index(tmp, format=fmt, kind=meta.pop("kind"), source=source, framework=framework,
                                splits=splits, **meta)
    if root.exists():
        shutil.rmtree(root)
    tmp.rename(root)
    say(f"toolkit shards: {len(train)} training and {len(evaluation)} evaluation samples of {source} in "
        f"{len(splits['train'])} + {len(splits['eval'])} {fmt} shards in {root}")
    return root / index.name
