"""Sharded streams in real jobs, in every framework: `toolkit shards` writes the framework's format
(WebDataset tar, TFRecord, RecordIO) with its index; a user's loop over `toolkit.shards(PATH,
ids=True)` on 2 ranks, stopped mid-epoch and resumed on 3 (TensorFlow: on 1; a change of world), reads every sample
once per epoch (counted by id); the built-in script trains ResNet-18 from `shards:PATH` on 2 ranks.
The plan's rules alone: tests/test_streams.py."""
import json
import re
import sys

import pytest

from tests.conftest import FRAMEWORKS, ROOT, run, toolkit, train_job

STREAM_LOOP = [sys.executable, str(ROOT / "tests" / "stream_loop.py")]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from toolkit.data.ondisk import digits_folder
    return digits_folder(tmp_path_factory.mktemp("digits") / "images")


def write_shards(fw, source, out, *extra):
    proc = toolkit("shards", source, out, "--framework", fw, *extra, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return json.loads((out / "index.json").read_text())


def stream_loop(fw, ranks, out, *args) -> dict:
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", ranks, "--gloo", "--timeout", 230, "--",
            *STREAM_LOOP, "--framework", fw, "--out", out, *args]
    proc = run(argv, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {**json.loads(out.read_text()), "stderr": proc.stderr}


@pytest.mark.parametrize("fw, world", [("torch", 3), ("tensorflow", 1), ("mxnet", 3)])
def test_every_sample_once_per_epoch_across_a_resume_on_more_ranks(fw, world, images, tmp_path):
    """Stopped mid-epoch on 2 ranks, resumed on `world` (TensorFlow on 1: three TensorFlow processes on
    2 cores cost the suite 10 s more, and 2 -> 1 is as much a new world)."""
    shards = tmp_path / "shards"
    index = write_shards(fw, f"imagefolder:{images}", shards, "--shard-size", "150")
    counts = [s["samples"] for s in index["splits"]["train"]]
    n = sum(counts)
    assert counts == [150] * (n // 150) + [n % 150] and sum(s["samples"] for s in index["splits"]["eval"]) == 1797 - n
    common = ["--shards", shards, "--checkpoint-dir", tmp_path / "ckpt", "--batch-size", "16", "--epochs", "2"]
    first = stream_loop(fw, 2, tmp_path / "a.json", *common, "--stop-at", "50")      # 44 steps an epoch: mid-epoch 2
    rest = stream_loop(fw, world, tmp_path / "b.json", *common, "--resume")
    for record in (first, rest):
        assert len(set(record["digests"])) == 1, "replicas differ"
    # epoch 1 whole on 2 ranks: every sample once, the ranks disjoint, only the last partial step dropped
    ranks = [set(seen["0"]) for seen in first["seen"]]
    assert sum(map(len, ranks)) == len(set().union(*ranks)) == n - n % 32 and max(set().union(*ranks)) < n
    # epoch 2: 6 steps on 2 ranks, then the rest on `world`: nothing twice, less than one step left
    epoch2 = [i for record in (first, rest) for seen in record["seen"] for i in seen.get("1", [])]
    assert len(epoch2) == len(set(epoch2)), "a sample read twice across the resume"
    assert 0 <= n - len(epoch2) < 16 * world and rest["steps"] - first["steps"] == (n - 6 * 32) // (16 * world)
    assert rest["world"] == world
    # each rank's random generators cannot continue on another number of ranks: reseeded, said once
    said = re.findall(r"random generators: .*", rest["stderr"])
    assert said == [f"random generators: it was saved by 2 ranks, resumed on {world}; reseeded from (seed, step, "
                    "rank)"], rest["stderr"][-3000:]
    assert rest["accuracy"] > 0.3, rest["accuracy"]     # a linear model of the pixels, 1.5 epochs; chance 0.1
    # the built-in script: ResNet-18 on 2 ranks from two of the shards (a brace pattern), every split's
    # samples decoded and augmented as imagefolder: does
    suffix = {"torch": "tar", "tensorflow": "tfrecord", "mxnet": "rec"}[fw]
    out = train_job("gloo", ["--framework", fw, "--model", "resnet18", "--dataset",
                             f"shards:{shards}/train-{{000000..000001}}.{suffix}", "--image-size", "32", "--epochs", "1",
                             "--batch-size", "16"])
    assert out["world_size"] == 2 and out["steps"] == 300 // 32
    assert len(set(out["final_digests"])) == 1 and out["accuracy"] is not None


def test_bad_shards_are_one_line(images, tmp_path):
    for args, says in ((["bogus:x", tmp_path / "o", "--framework", "torch"], "SOURCE is imagefolder:PATH"),
                       ([f"imagefolder:{tmp_path / 'none'}", tmp_path / "o", "--framework", "torch"], "no folder"),
                       ([f"imagefolder:{images}", tmp_path / "o", "--framework", "torch", "--shard-size", "0"],
                        "--shard-size 0")):
        proc = toolkit("shards", *args)
        assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    # another framework's shards: one line naming the fix (the index is read before any framework)
    from toolkit import config
    from toolkit.data import datasets, streams
    from toolkit.errors import ToolkitError
    (tmp_path / "rec").mkdir()
    streams.write_index(tmp_path / "rec", format="recordio", kind="image", source="x", framework="mxnet",
                        num_classes=10, splits={"train": [], "eval": []})
    (tmp_path / "rec" / "train-000000.rec").write_bytes(b"")
    streams.write_index(tmp_path / "rec", format="recordio", kind="image", source="x", framework="mxnet",
                        num_classes=10, splits={"train": [("train-000000.rec", 5)], "eval": []})
    c = config.resolve({"framework": "torch", "model": "resnet18", "dataset": f"shards:{tmp_path / 'rec'}",
                        "image_size": 32})
    with pytest.raises(ToolkitError, match=r"recordio shards \(mxnet's\).*--framework torch"):
        datasets.from_shards(c, str(tmp_path / "rec"))


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_a_stream_the_toolkit_did_not_shard_trains_and_says_so_once(fw, tmp_path):
    """A torch IterableDataset, a tf.data stream of unknown length, an iterable of samples for MXNet:
    every rank reads its own (rank 1's is 16 samples shorter); all stop when one runs out (no rank
    left alone in an allreduce), the replicas stay identical, and the notice is one line, once."""
    out = tmp_path / "foreign.json"
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", 2, "--gloo", "--timeout", 150, "--",
            *STREAM_LOOP, "--framework", fw, "--foreign", "100", "--epochs", "2", "--out", out]
    proc = run(argv, timeout=160)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["steps"] == 2 * (84 // 16) and len(set(record["digests"])) == 1, record
    assert proc.stderr.count("a stream the toolkit did not shard") == 1, proc.stderr[-3000:]


def test_cifar10_and_text_shards_hold_the_source_samples_under_their_ids(tmp_path):
    """What `toolkit shards` writes from CIFAR-10 (pixels as PNG) and from a text (windows of context + 1
    bytes) is the source's samples, each under its id, read back with plain tarfile (no toolkit reader)."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    from tests.workload_data import cifar_folder, text_file
    from toolkit.data import ondisk

    def samples(folder, split):
        index = json.loads((folder / "index.json").read_text())
        out = {}
        for shard in index["splits"][split]:
            with tarfile.open(folder / shard["file"]) as tar:
                for member in tar.getmembers():
                    key, ext = member.name.split(".", 1)
                    out.setdefault(int(key), {})[ext] = tar.extractfile(member).read()
            assert len(out) == sum(s["samples"] for s in index["splits"][split][: index["splits"][split].index(shard) + 1])
        return index, out

    cifar_folder(tmp_path / "cifar")
    write_shards("torch", f"cifar10:{tmp_path / 'cifar'}", tmp_path / "c", "--shard-size", "30")
    (x, y), (xt, yt) = ondisk.cifar10_pixels("c", str(tmp_path / "cifar"))
    index, train = samples(tmp_path / "c", "train")
    assert index["image_size"] == 32 and index["mean"] == list(ondisk.CIFAR_MEAN) and sorted(train) == list(range(80))
    for i, sample in train.items():
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(sample["png"]))), x[i]) and int(sample["cls"]) == y[i]
    assert [int(k) for k in list(train)[:5]] != list(range(5)), "training samples written in the source's order"
    _, test = samples(tmp_path / "c", "eval")
    assert all(np.array_equal(np.asarray(Image.open(io.BytesIO(s["png"]))), xt[i]) for i, s in test.items())

    text_file(tmp_path / "t.txt")
    write_shards("torch", f"text:{tmp_path / 't.txt'}", tmp_path / "t", "--context", "16", "--shard-size", "100")
    (wx, wy), _ = ondisk.text("t", str(tmp_path / "t.txt"), 16)
    index, windows = samples(tmp_path / "t", "train")
    assert index["kind"] == "tokens" and index["context"] == 16 and len(windows) == len(wx)
    for i, sample in windows.items():
        tokens = np.frombuffer(sample["bin"], np.uint8)
        assert np.array_equal(tokens[:-1], wx[i]) and np.array_equal(tokens[1:], wy[i])


TF_ORDER = """
import sys, json
import tensorflow as tf
from toolkit.data import stream_sampler, streams
from toolkit.adapters.tensorflow import shards as tfs
src = streams.shards(sys.argv[1], ids=True)
feature = {"id": tf.io.FixedLenFeature([], tf.int64)}
def read(shard, ranges):
    for a, b in ranges:
        yield from (r.numpy() for r in tf.data.TFRecordDataset(shard.path).skip(a).take(b - a))
out = []
for world, rank, consumed in [(2, 1, 0), (2, 0, 40), (3, 2, 200)]:
    s = stream_sampler.StreamSampler([x.samples for x in src.shards], 8, 1, world, range(rank, rank + 1), seed=3, window=64)
    s.load_state_dict({"epoch": 2, "segments": [[world, consumed]]})
    reads = s.reads()
    ids = lambda records: [int(tf.io.parse_single_example(r, feature)["id"]) for r in records]
    out.append([ids(tfs.records(src, reads)), ids(reads.records(read, src.shards)), s.samples_left()])
print(json.dumps(out))
"""


def test_tensorflows_reader_gives_the_plans_order_in_tf_data(images, tmp_path):
    """TensorFlow's reader reorders the stream inside tf.data (no Python per record); it gives the plan's
    order exactly (the same as the core's reordering of plainly read records), mid-window resumes too."""
    write_shards("tensorflow", f"imagefolder:{images}", tmp_path / "s", "--shard-size", "150")
    proc = run([sys.executable, "-c", TF_ORDER, tmp_path / "s"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for in_tf, plan, left in json.loads(proc.stdout.splitlines()[-1]):
        assert in_tf == plan and len(plan) == left and len(set(plan)) == left
