"""A user's own loop over shards written by `toolkit shards` (`session.loader(toolkit.shards(PATH,
ids=True))`): every sample carries its id, so tests/test_shards.py counts what every rank read; the
run can stop after a checkpoint and resume from it, on another number of ranks.

    toolkit launch -np 2 --gloo -- python tests/stream_loop.py --framework torch --shards S --out out.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import toolkit  # noqa: E402
from tests.user_loop import host, loss_and_tape  # noqa: E402


def flat_model(framework: str, size: int):
    """A linear classifier of the images' pixels (the test is about the data, not the model)."""
    if framework == "torch":
        import torch
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * size * size, 10))
    if framework == "tensorflow":
        import keras
        return keras.Sequential([keras.Input((size, size, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
    from mxnet import gluon
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Flatten(), gluon.nn.Dense(10, in_units=3 * size * size))
    return net


def foreign(framework: str, n: int):
    """A stream the toolkit did not shard, of `n` samples (x: 3 x 32 x 32 / 32 x 32 x 3, y), as each
    framework's users write one."""
    import numpy as np
    rng = np.random.RandomState(0)
    shape = (32, 32, 3) if framework == "tensorflow" else (3, 32, 32)
    x, y = rng.standard_normal((n, *shape)).astype(np.float32), rng.randint(0, 10, n)
    if framework == "torch":
        import torch

        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                return ((torch.from_numpy(a), int(b)) for a, b in zip(x, y))
        return Stream()
    if framework == "tensorflow":
        import tensorflow as tf
        return tf.data.Dataset.from_generator(lambda: zip(x, y), output_signature=(
            tf.TensorSpec(shape, tf.float32), tf.TensorSpec((), tf.int64)))

    class Samples:          # an iterable of samples, restartable, no length
        def __iter__(self):
            return ((a, np.float32(b)) for a, b in zip(x, y))
    return Samples()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", required=True)
    p.add_argument("--shards")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--stop-at", type=int, default=0, help="save a checkpoint after this many steps and exit")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--foreign", type=int, default=0, help="a stream of this many samples (less 16 per rank) "
                   "the toolkit did not shard, instead of --shards")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    session = toolkit.start(framework=a.framework, batch_size=a.batch_size, optimizer="sgd", lr=0.05,
                            image_size=32, checkpoint_dir=a.checkpoint_dir, resume=a.resume)
    with session.scope():
        model = flat_model(a.framework, 32)
    model, _ = session.setup(model)
    if a.foreign:
        loader, steps = session.loader(foreign(a.framework, a.foreign - 16 * session.rank)), 0
        for epoch in range(a.epochs):
            loader.set_epoch(epoch)
            for x, y in loader:
                session.backward(*loss_and_tape(a.framework, session, model, x, y))
                steps += session.step()
        if session.is_main:
            Path(a.out).write_text(json.dumps({"steps": steps, "digests": session.check_replicas()}))
        else:
            session.check_replicas()
        return 0
    loader = session.loader(toolkit.shards(a.shards, ids=True))
    start = session.load()["epoch"] if a.resume else 0
    seen, steps, stopped = {}, session.global_step, False
    for epoch in range(start, a.epochs):
        loader.set_epoch(epoch)
        for x, y, ids in loader:
            seen.setdefault(epoch, []).extend(int(i) for i in host(ids).ravel())
            session.backward(*loss_and_tape(a.framework, session, model, x, y))
            if session.step():
                steps += 1
                if steps == a.stop_at:
                    session.save(epoch=epoch)
                    stopped = True
                    break
        if stopped:
            break
    evaluation = session.loader(toolkit.shards(a.shards, split="eval"), train=False)
    loss, accuracy = session.evaluate(evaluation)
    seen_all = session.allgather_object(seen, name="seen")
    digests = session.check_replicas()
    if session.is_main:
        Path(a.out).write_text(json.dumps({"seen": seen_all, "digests": digests, "steps": steps,
                                           "world": session.world_size, "accuracy": accuracy,
                                           "steps_per_epoch": loader.steps_per_epoch}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
