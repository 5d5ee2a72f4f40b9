"""`imagefolder:PATH` at 200,000 files (toolkit/data/ondisk.py, adapters/<framework>/images.py): rank 0
lists the folder once and shares the list, the check before training reads a fixed sample of files,
a bad file the sample missed is one line naming it when a reader reaches it, and the held-out split
is the one the every-file listing made. benchmarks/imagefolder_bench.py times it."""
from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from toolkit.data import ondisk
from toolkit.errors import ToolkitError

SPEC = "imagefolder:x"
# digits_folder(per_class=5)'s held-out files, as the code before the shared listing chose them
HELD_OUT_FILES = ["0/20.png", "0/36.png", "2/12.png", "2/2.png", "4/4.png", "5/32.png", "5/33.png", "6/26.png",
                  "7/44.png", "8/28.png"]


def two_ranks(is_main: bool, rank0_sends=None):
    """A started 2-rank session as image_folder sees it: broadcast_object gives rank 0's object."""
    sent = []

    def broadcast_object(obj, name, root=0):
        assert name == "toolkit.imagefolder" and root == 0
        sent.append(obj)
        return obj if is_main else rank0_sends
    return SimpleNamespace(is_main=is_main, size=2, config=SimpleNamespace(elastic=False),
                           broadcast_object=broadcast_object, sent=sent)


def test_rank_0_lists_the_folder_and_the_other_ranks_take_its_list(tmp_path, monkeypatch):
    root = ondisk.digits_folder(tmp_path / "d", per_class=5)
    rank0 = two_ranks(True)
    folder = ondisk.image_folder(SPEC, str(root), rank0)
    assert rank0.sent == [folder] and len(folder.train_files) == 40 and len(folder.eval_files) == 10

    def no(*args, **kwargs):
        raise AssertionError("a rank other than 0 listed or read the folder")
    for module, name in ((os, "scandir"), (os, "listdir"), (Path, "iterdir"), (ondisk, "open")):
        monkeypatch.setattr(module, name, no, raising=False)
    assert ondisk.image_folder(SPEC, str(root), two_ranks(False, rank0_sends=folder)) == folder
    # rank 0's failure is shared too: the other ranks stop with its line instead of waiting for a list
    rank0 = two_ranks(True)
    with pytest.raises(ToolkitError, match="no folder /nope"):
        ondisk.image_folder(SPEC, "/nope", rank0)
    assert len(rank0.sent) == 1 and "no folder /nope" in rank0.sent[0]
    with pytest.raises(ToolkitError, match="no folder /nope"):
        ondisk.image_folder(SPEC, "/nope", two_ranks(False, rank0_sends=rank0.sent[0]))


def test_the_split_is_the_one_every_file_listing_made(tmp_path):
    """Class folders only: the same sorted files, the same RandomState(0) 20% held out, as before."""
    root = ondisk.digits_folder(tmp_path / "d", per_class=5)
    folder = ondisk.image_folder(SPEC, str(root))
    files = sorted(root.glob("*/*.png"), key=lambda f: (f.parent.name, f.name))
    order = np.random.RandomState(0).permutation(len(files))
    held, kept = sorted(order[:10].tolist()), sorted(order[10:].tolist())
    assert [Path(f).relative_to(root).as_posix() for f in folder.eval_files] == HELD_OUT_FILES
    assert folder.eval_files == tuple(str(files[i]) for i in held)
    assert folder.train_files == tuple(str(files[i]) for i in kept)
    assert folder.train_labels == tuple(int(files[i].parent.name) for i in kept)
    assert folder.eval_labels == tuple(int(files[i].parent.name) for i in held)
    # ImageNet's layout: train/ is trained on, val/ evaluated, labels by class folder
    split = ondisk.digits_folder(tmp_path / "tv", per_class=10, layout="train_val")
    folder = ondisk.image_folder(SPEC, str(split))
    assert not folder.held_out and len(folder.train_files) == 80 and len(folder.eval_files) == 20
    assert all(Path(f).parts[-3:-1] == ("val", folder.classes[y])
               for f, y in zip(folder.eval_files, folder.eval_labels))
    assert folder.train_files == tuple(sorted(folder.train_files, key=lambda f: (Path(f).parent.name, Path(f).name)))


def corrupt_outside_the_sample(tmp_path, monkeypatch) -> tuple[ondisk.ImageFolder, int]:
    """A 50-file folder checked through a 4-file sample, one training file outside it corrupt: the
    listing passes (the check reads the sample only) and returns the folder and that file's position."""
    root = ondisk.digits_folder(tmp_path / "d", per_class=5)
    monkeypatch.setattr(ondisk, "SAMPLE", 4)
    opened = []
    monkeypatch.setattr(ondisk, "open", lambda f, *a: (opened.append(f), builtins.open(f, *a))[1], raising=False)
    folder = ondisk.image_folder(SPEC, str(root))
    assert len(opened) == 4
    position = next(i for i, f in enumerate(folder.train_files) if f not in opened)
    Path(folder.train_files[position]).write_bytes(b"<html>not an image</html>")
    assert ondisk.image_folder(SPEC, str(root)) == folder
    return folder, position


def one_line(error: str, path: str) -> None:
    assert error.startswith(f"dataset={SPEC!r}: {path} cannot be read (") and error.endswith(
        "); remove or replace it") and "\n" not in error, error


def test_a_bad_file_the_sample_missed_is_named_when_torch_reads_it(tmp_path, monkeypatch):
    from toolkit.adapters.torch import images
    folder, position = corrupt_outside_the_sample(tmp_path, monkeypatch)
    train, evaluation = images.read(folder, SimpleNamespace(augment=True), 32)
    x, y = train[position - 1 if position else position + 1]
    assert tuple(x.shape) == (3, 32, 32) and len(train) == 40 and len(evaluation) == 10
    with pytest.raises(ToolkitError) as caught:
        train[position]
    one_line(str(caught.value), folder.train_files[position])


READ_ALL = """
import pickle, sys
from types import SimpleNamespace
from toolkit.errors import ToolkitError
folder, framework = pickle.load(open(sys.argv[1], "rb")), sys.argv[2]
from toolkit import registry
train, _ = registry.reader(framework, "images").read(folder, SimpleNamespace(augment=True), 32)
try:
    if framework == "tensorflow":       # through the sessions' tf.data path, where the error is translated
        from toolkit.adapters.tensorflow.data import batches
        sampler = SimpleNamespace(batch_size=4, world=1, train=True, shuffle=True, n=40, seed=0, epoch=0,
                                  replicas=[0], position=0)
        for _ in batches(train, range(10), sampler):
            pass
    else:
        for i in range(len(train)):
            train[i]
except ToolkitError as e:
    print("ERROR", e)
"""


@pytest.mark.parametrize("framework", ("tensorflow", "mxnet"))
def test_a_bad_file_the_sample_missed_is_named_when_tensorflow_or_mxnet_reads_it(framework, tmp_path, monkeypatch):
    import pickle
    folder, position = corrupt_outside_the_sample(tmp_path, monkeypatch)
    (tmp_path / "folder.pickle").write_bytes(pickle.dumps(folder))
    proc = subprocess.run([sys.executable, "-c", READ_ALL, str(tmp_path / "folder.pickle"), framework],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ERROR ")]
    assert len(lines) == 1, proc.stdout
    one_line(lines[0][len("ERROR "):], folder.train_files[position])
