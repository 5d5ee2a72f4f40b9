"""The sharded stream's guarantee, framework-free (toolkit/data/stream_sampler.py, toolkit/data/streams.py): every sample once per
epoch across the ranks, a resume mid-epoch and a change of world that neither repeat nor skip a
sample, shards dealt balanced by sample count, each rank reading only its part of a shard. The
real readers and jobs: tests/test_shards.py."""
import json

import numpy as np
import pytest

from toolkit.data import stream_sampler, streams
from toolkit.errors import ToolkitError

SIZES = [37, 50, 8, 61, 44, 29, 70, 13]          # samples per shard: uneven, as real shards end


def _ids(sizes):
    starts = np.cumsum([0] + sizes[:-1])
    return lambda shard, ranges: (int(starts[shard]) + i for a, b in ranges for i in range(a, b))


def _samplers(world, b=4, k=2, window=16, seed=3, train=True, sizes=SIZES):
    return [stream_sampler.StreamSampler(sizes, b, k, world, range(r, r + 1), seed, train=train, window=window)
            for r in range(world)]


def _run(samplers, steps, read=None, reads_seen=None):
    """`steps` synchronous optimizer steps (None: to the end of the epoch) on every sampler; the ids
    each consumed."""
    read = read or _ids(SIZES)
    streams_ = [iter(s.reads().records(read, list(range(len(SIZES))))) for s in samplers]
    left = min(s.steps_left() for s in samplers)
    assert len({s.steps_left() for s in samplers}) == 1, "ranks disagree on the steps left"
    seen = [[] for _ in samplers]
    for _ in range(left if steps is None else steps):
        for r, (s, it) in enumerate(zip(samplers, streams_)):
            seen[r] += [next(it) for _ in range(s.per_step)]
            s.advance()
    return seen


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_once_per_epoch_and_the_tail_dropped(world):
    samplers = _samplers(world)
    for epoch in range(3):
        for s in samplers:
            s.set_epoch(epoch)
        seen = [i for ids in _run(samplers, None) for i in ids]
        n, step = sum(SIZES), 8 * world
        assert len(seen) == len(set(seen)) == (n // step) * step, "a sample repeated, or too few read"
        assert len(seen) == samplers[0].steps_per_epoch * step
    # the epochs differ (the shards' order and the windows move with the epoch)
    orders = []
    for epoch in (0, 1):
        s = _samplers(1)[0]
        s.set_epoch(epoch)
        orders.append(_run([s], 3)[0])
    assert orders[0] != orders[1]


def test_each_rank_reads_only_its_contiguous_part():
    samplers = _samplers(3, window=1)
    reads = [s.reads() for s in samplers]
    per_rank = [sum(b - a for _, ranges in r.pieces for a, b in ranges) for r in reads]
    assert per_rank == [samplers[0].steps_left() * 8] * 3      # balanced by sample count, nothing else read
    shards = [[shard for shard, _ in r.pieces] for r in reads]
    # a rank's span is contiguous in the epoch's shard order: at most its two end shards are shared
    for a, b in zip(shards, shards[1:]):
        assert len(set(a) & set(b)) <= 1


@pytest.mark.parametrize("worlds", [(2, 2), (2, 3), (3, 1), (2, 4, 1)])
def test_resume_and_resize_mid_epoch_neither_repeat_nor_skip(worlds):
    """A run stopped after a few steps and resumed from its state (the same world or another, more
    than once): the union is every sample once, as many as the last world's tail allows."""
    state, seen = None, []
    for j, world in enumerate(worlds):
        samplers = _samplers(world)
        for s in samplers:
            s.set_epoch(1)
            if state is not None:
                s.load_state_dict(json.loads(json.dumps(state)))    # as a checkpoint carries it
        ids = _run(samplers, 3 if j < len(worlds) - 1 else None)
        seen += [i for r in ids for i in r]
        state = samplers[0].state_dict()
        assert all(s.state_dict() == state for s in samplers)
    assert len(seen) == len(set(seen)), "a sample was read twice across the resume"
    assert sum(SIZES) - len(seen) < 8 * worlds[-1], "more than one step's samples left unread"
    assert state["position"] == len(seen)


def test_resume_in_the_same_world_is_the_uninterrupted_stream():
    whole = _run(_samplers(2), None)
    first = _samplers(2)
    part = _run(first, 3)              # 24 samples a rank: inside the second window of 16
    again = _samplers(2)
    for s in again:
        s.load_state_dict(first[0].state_dict())
    rest = _run(again, None)
    assert [p + r for p, r in zip(part, rest)] == whole


def test_a_resume_skips_whole_windows_without_reading_them():
    first = _samplers(1, window=16)
    _run(first, 5)                                   # 40 samples: 2 whole windows and 8 of the third
    again = _samplers(1, window=16)[0]
    again.load_state_dict(first[0].state_dict())
    reads = again.reads()
    assert reads.skip == 8
    assert sum(b - a for _, ranges in reads.pieces for a, b in ranges) == again.steps_left() * 8 + 8


def test_evaluation_reads_every_sample_once_in_order():
    samplers = _samplers(3, b=5, train=False)
    seen = []
    for s in samplers:
        it = iter(s.reads().records(_ids(SIZES), list(range(len(SIZES)))))
        for _ in range(s.steps_left()):
            batch = [x for _, x in zip(range(5), it)]
            s.advance(len(batch))
            seen += batch
    assert seen == list(range(sum(SIZES)))
    assert [s.steps_per_epoch for s in samplers] == [-(-n // 5) for n in (104, 104, 104)]


def test_braces_and_globs_name_training_shards(tmp_path):
    for name in ("train-000000.tar", "train-000001.tar", "train-000002.tar", "eval-000000.tar"):
        (tmp_path / name).write_bytes(b"")
    streams.write_index(tmp_path, format="webdataset", kind="image", source="x", framework="torch", num_classes=2,
                        splits={"train": [("train-000000.tar", 3), ("train-000001.tar", 4), ("train-000002.tar", 5)],
                                "eval": [("eval-000000.tar", 2)]})
    assert streams.expand_braces("a-{000..002}-{x,y}") == [f"a-{i:03d}-{c}" for i in range(3) for c in "xy"]
    index = streams.read_index("s", str(tmp_path / "train-{000000..000001}.tar"))
    assert [s.samples for s in index.train] == [3, 4] and [s.samples for s in index.eval] == [2]
    assert [s.samples for s in streams.read_index("s", str(tmp_path / "train-*.tar")).train] == [3, 4, 5]
    assert len(streams.read_index("s", str(tmp_path)).train) == 3
    with pytest.raises(ToolkitError, match="not a training shard"):
        streams.read_index("s", str(tmp_path / "*.tar"))
    with pytest.raises(ToolkitError, match="no index.json"):
        streams.read_index("s", str(tmp_path.parent))
    with pytest.raises(ToolkitError, match="no folder or shard files"):
        streams.read_index("s", str(tmp_path / "nothing-*.tar"))
