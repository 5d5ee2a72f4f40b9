"""Learning-rate scaling/warm-up and the data split across ranks (pure functions, no framework)."""
import math

import numpy as np
import pytest

from toolkit.run import data, schedule
from toolkit.config import Config, LrScaling


@pytest.mark.parametrize("scaling, size, expected", [
    (LrScaling.NONE, 4, 0.1), (LrScaling.LINEAR, 4, 0.4), (LrScaling.SQRT, 4, 0.2), (LrScaling.LINEAR, 1, 0.1),
])
def test_scaled_lr(scaling, size, expected):
    assert schedule.scaled_lr(Config(lr=0.1, lr_scaling=scaling), size) == pytest.approx(expected)


def test_warmup_goes_from_unscaled_to_scaled_lr():
    c = Config(lr=0.1, lr_scaling=LrScaling.LINEAR, warmup_epochs=2)
    lrs = [schedule.lr_at(c, 4, step, steps_per_epoch=10) for step in range(25)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[10] == pytest.approx(0.25)
    assert all(b > a for a, b in zip(lrs[:20], lrs[1:20]))
    assert lrs[20:] == [pytest.approx(0.4)] * 5


def test_warmup_without_scaling_ramps_from_small_to_lr():
    c = Config(lr=0.1, warmup_epochs=1)
    lrs = [schedule.lr_at(c, 2, step, steps_per_epoch=4) for step in range(6)]
    assert lrs[0] == pytest.approx(0.025) and lrs[3] < 0.1 and lrs[4:] == [pytest.approx(0.1)] * 2
    assert schedule.lr_at(Config(lr=0.1), 2, 0, 4) == 0.1


@pytest.mark.parametrize("size, k, b", [(2, 2, 8), (3, 1, 5), (4, 3, 2)])
def test_ranks_times_accumulation_see_the_large_batch(size, k, b):
    n, epoch, seed = 1437, 3, 7
    shards = [data.epoch_shard(n, epoch, seed, r, size) for r in range(size)]
    single = data.epoch_shard(n, epoch, seed, 0, 1)
    big = size * k * b
    steps = data.steps_per_epoch(n, size, b, k)
    assert steps == data.steps_per_epoch(n, 1, big, 1) == n // big
    for s in range(steps):
        together = np.concatenate([shard[s * k * b:(s + 1) * k * b] for shard in shards])
        assert sorted(together) == sorted(single[s * big:(s + 1) * big])


def test_shards_are_disjoint_equal_and_reshuffled_each_epoch():
    shards = [data.epoch_shard(101, 0, 1, r, 4) for r in range(4)]
    assert {len(s) for s in shards} == {25}
    assert len(set(np.concatenate(shards))) == 100
    assert not np.array_equal(data.epoch_shard(101, 0, 1, 0, 4), data.epoch_shard(101, 1, 1, 0, 4))


def test_datasets_are_real_and_split_the_same_way():
    digits = data.load(Config())
    assert digits.x_train.shape == (1437, 64) and digits.x_test.shape == (360, 64)
    assert digits.num_classes == 10 and set(np.unique(digits.y_train)) == set(range(10))
    assert 0 <= digits.x_train.min() and digits.x_train.max() <= 1
    assert np.array_equal(data.load(Config(seed=3)).x_train, digits.x_train), "split must not depend on seed"
    synthetic = data.load(Config(dataset="synthetic"))
    assert synthetic.num_features == 64 and len(np.unique(synthetic.y_train)) == 10
    assert not math.isnan(float(synthetic.x_train.sum()))


@pytest.mark.parametrize("size, k, b", [(2, 2, 8), (3, 1, 5)])
def test_step_indices_are_the_shards_and_survive_a_resize(size, k, b):
    n, epoch, seed = 1437, 2, 7
    order = data.epoch_order(n, epoch, seed)
    shards = [data.epoch_shard(n, epoch, seed, r, size) for r in range(size)]
    steps = data.steps_left(n, 0, size, b, k)
    assert steps == data.steps_per_epoch(n, size, b, k)
    for s in range(steps):
        micro = data.step_indices(order, s * b * k * size, b, k, size, range(size))
        for j in range(k):
            assert np.array_equal(micro[j], np.concatenate([sh[(s * k + j) * b:(s * k + j + 1) * b] for sh in shards]))
    # two steps on `size` replicas, then the world shrinks to 1 and grows to 4: every sample once
    seen, position = [], 0
    for world in (size, size, 1, 4, 4):
        micro = data.step_indices(order, position, b, k, world, range(world))
        seen += [i for m in micro for i in m]
        position += b * k * world
    assert len(seen) == len(set(seen)) == position and sorted(seen) == sorted(order[:position])
    assert data.steps_left(n, position, 4, b, k) == (n - position) // (b * k * 4)
