"""Learning-rate scaling, warm-up and schedules, and the data split across ranks (pure functions, no framework),
and the schedule's lr as a real 2-rank run logs it."""
import json
import math

import numpy as np
import pytest

from tests.conftest import horovod_status, train_job
from toolkit.config import Config, LrScaling, LrSchedule
from toolkit.data import datasets, sampler
from toolkit.run import schedule


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


def test_constant_schedule_is_the_default_and_unchanged_bit_for_bit():
    """lr_schedule constant (the default) is the lr of before the key existed: warm-up, then the scaled lr."""
    for c in (Config(lr=0.1, lr_scaling=LrScaling.LINEAR, warmup_epochs=2), Config(lr=0.07, warmup_epochs=0.5),
              Config(lr=0.3)):
        assert c.lr_schedule is LrSchedule.CONSTANT
        target = schedule.scaled_lr(c, 4)
        warmup = int(round(c.warmup_epochs * 10))
        start = c.lr if target > c.lr else target / max(warmup, 1)
        before = [start + (target - start) * step / warmup if step < warmup else target for step in range(40)]
        assert [schedule.lr_at(c, 4, step, steps_per_epoch=10) for step in range(40)] == before


def test_cosine_schedule_decays_from_the_scaled_lr_to_zero_after_the_warmup():
    """After `warmup_epochs`, lr = scaled lr x (1 + cos(pi x t / T)) / 2 with t the steps since the warm-up and
    T the steps left in the run (epochs x steps_per_epoch - warm-up steps): 0 when the last step is done."""
    c = Config(lr=0.1, lr_scaling=LrScaling.LINEAR, warmup_epochs=1, epochs=4, lr_schedule=LrSchedule.COSINE)
    spe, target = 10, 0.2
    lrs = [schedule.lr_at(c, 2, step, steps_per_epoch=spe) for step in range(41)]
    warm = Config(lr=0.1, lr_scaling=LrScaling.LINEAR, warmup_epochs=1, epochs=4)
    assert lrs[:10] == [schedule.lr_at(warm, 2, step, spe) for step in range(10)], "the warm-up is kept"
    expected = [target * (1 + math.cos(math.pi * (step - 10) / 30)) / 2 for step in range(10, 41)]
    assert lrs[10:] == pytest.approx(expected, abs=1e-15)
    assert lrs[10] == pytest.approx(target) and lrs[25] == pytest.approx(target / 2) and lrs[40] == pytest.approx(0)
    assert all(b < a for a, b in zip(lrs[10:], lrs[11:]))
    # without warm-up it starts at the scaled lr at step 0, and goes no lower than 0 past the end
    plain = Config(lr=0.1, epochs=2, lr_schedule=LrSchedule.COSINE)
    assert schedule.lr_at(plain, 1, 0, 5) == 0.1 and schedule.lr_at(plain, 1, 7, 5) == pytest.approx(
        0.05 * (1 + math.cos(math.pi * 0.7))) and schedule.lr_at(plain, 1, 12, 5) == 0.0


def test_step_schedule_multiplies_by_gamma_every_lr_step_epochs():
    """torch's StepLR counted in epochs from the first step: lr = scaled lr x gamma ** floor(step / (lr_step_epochs
    x steps_per_epoch)); the warm-up ramps to the scaled lr as with every schedule."""
    c = Config(lr=0.1, lr_schedule=LrSchedule.STEP, lr_step_epochs=1.5, lr_step_gamma=0.5, warmup_epochs=1, epochs=6)
    spe = 4                                   # a decay every 6 steps
    lrs = [schedule.lr_at(c, 1, step, steps_per_epoch=spe) for step in range(24)]
    assert lrs[:4] == [0.025 + (0.1 - 0.025) * step / 4 for step in range(4)]
    assert lrs[4:] == [0.1 * 0.5 ** (step // 6) for step in range(4, 24)]
    defaults = Config(lr_schedule=LrSchedule.STEP)
    assert (defaults.lr_step_epochs, defaults.lr_step_gamma) == (30, 0.1)
    assert schedule.lr_at(defaults, 1, 30 * 7 - 1, 7) == defaults.lr and schedule.lr_at(defaults, 1, 30 * 7, 7) == \
        pytest.approx(defaults.lr * 0.1) and schedule.lr_at(defaults, 1, 60 * 7, 7) == pytest.approx(defaults.lr * 0.01)


@pytest.mark.distributed
def test_two_ranks_log_the_cosine_schedules_lr_each_epoch(tmp_path):
    """examples/train.py on 2 ranks (toolkit launch, Gloo), --lr-schedule cosine after a 1-epoch warm-up with
    linear scaling: each epoch's line in metrics.jsonl carries the lr of its last step, as the closed form says."""
    if horovod_status("torch"):
        pytest.skip(f"horovod.torch does not import ({horovod_status('torch')}); run `make setup`")
    out = train_job("gloo", ["--framework", "torch", "--dataset", "digits", "--epochs", "3", "--lr", "0.05",
                             "--lr-scaling", "linear", "--warmup-epochs", "1", "--lr-schedule", "cosine", "--log-dir",
                             tmp_path], timeout=240)
    spe = 1437 // (2 * 32)                    # 22 steps per epoch: 2 ranks x batch 32
    base, target = 0.05, 0.1
    warm = base + (target - base) * (spe - 1) / spe
    expected = [warm] + [target * (1 + math.cos(math.pi * (step - spe) / (2 * spe))) / 2
                         for step in (2 * spe - 1, 3 * spe - 1)]
    logged = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == pytest.approx(expected, rel=1e-9) and logged[1] > logged[2] > 0
    assert out["lr"] == pytest.approx(expected[-1], rel=1e-9) and out["steps"] == 3 * spe


@pytest.mark.parametrize("size, k, b", [(2, 2, 8), (3, 1, 5), (4, 3, 2)])
def test_ranks_times_accumulation_see_the_large_batch(size, k, b):
    n, epoch, seed = 1437, 3, 7
    shards = [sampler.epoch_shard(n, epoch, seed, r, size) for r in range(size)]
    single = sampler.epoch_shard(n, epoch, seed, 0, 1)
    big = size * k * b
    steps = sampler.steps_per_epoch(n, size, b, k)
    assert steps == sampler.steps_per_epoch(n, 1, big, 1) == n // big
    for s in range(steps):
        together = np.concatenate([shard[s * k * b:(s + 1) * k * b] for shard in shards])
        assert sorted(together) == sorted(single[s * big:(s + 1) * big])


def test_shards_are_disjoint_equal_and_reshuffled_each_epoch():
    shards = [sampler.epoch_shard(101, 0, 1, r, 4) for r in range(4)]
    assert {len(s) for s in shards} == {25}
    assert len(set(np.concatenate(shards))) == 100
    assert not np.array_equal(sampler.epoch_shard(101, 0, 1, 0, 4), sampler.epoch_shard(101, 1, 1, 0, 4))


def test_datasets_are_real_and_split_the_same_way():
    digits = datasets.load(Config())
    assert digits.x_train.shape == (1437, 64) and digits.x_test.shape == (360, 64)
    assert digits.num_classes == 10 and set(np.unique(digits.y_train)) == set(range(10))
    assert 0 <= digits.x_train.min() and digits.x_train.max() <= 1
    assert np.array_equal(datasets.load(Config(seed=3)).x_train, digits.x_train), "split must not depend on seed"
    synthetic = datasets.load(Config(dataset="synthetic"))
    assert synthetic.num_features == 64 and len(np.unique(synthetic.y_train)) == 10
    assert not math.isnan(float(synthetic.x_train.sum()))


def test_digits_are_scikit_learns_read_without_importing_it():
    """Every process that trains on digits reads them; importing scikit-learn would cost it ~2 s of CPU."""
    import subprocess
    import sys
    probe = "import sys; from toolkit.data import ondisk; x, y = ondisk.digits_arrays(); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False"], out.stderr[-2000:]
    from sklearn.datasets import load_digits

    from toolkit.data import ondisk
    x, y = ondisk.digits_arrays()
    assert np.array_equal(x, load_digits().data) and np.array_equal(y, load_digits().target)


@pytest.mark.parametrize("size, k, b", [(2, 2, 8), (3, 1, 5)])
def test_step_indices_are_the_shards_and_survive_a_resize(size, k, b):
    n, epoch, seed = 1437, 2, 7
    order = sampler.epoch_order(n, epoch, seed)
    shards = [sampler.epoch_shard(n, epoch, seed, r, size) for r in range(size)]
    steps = sampler.steps_left(n, 0, size, b, k)
    assert steps == sampler.steps_per_epoch(n, size, b, k)
    for s in range(steps):
        micro = sampler.step_indices(order, s * b * k * size, b, k, size, range(size))
        for j in range(k):
            assert np.array_equal(micro[j], np.concatenate([sh[(s * k + j) * b:(s * k + j + 1) * b] for sh in shards]))
    # two steps on `size` replicas, then the world shrinks to 1 and grows to 4: every sample once
    seen, position = [], 0
    for world in (size, size, 1, 4, 4):
        micro = sampler.step_indices(order, position, b, k, world, range(world))
        seen += [i for m in micro for i in m]
        position += b * k * world
    assert len(seen) == len(set(seen)) == position and sorted(seen) == sorted(order[:position])
    assert sampler.steps_left(n, position, 4, b, k) == (n - position) // (b * k * 4)
