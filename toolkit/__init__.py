"""toolkit: Horovod that works today, for PyTorch, TensorFlow/Keras 3 and MXNet.

    import toolkit
    session = toolkit.start(framework="torch", lr=0.1)     # or start("cfg.yaml"), start({...})
    model, optimizer = session.setup(model, optimizer)

`import toolkit` imports no framework: `start` imports the chosen one. The verbs of a session are
in adapters/base.py and docs/API.md.
"""
__version__ = "0.6.0"      # the distribution horovod-toolkit; CHANGELOG.md


def start(config=None, comm=None, **keys):
    """Start this rank: resolve the config (a YAML path, a dict, a Config or nothing; then
    TOOLKIT_* variables; then keyword arguments), hvd.init, one GPU per local rank (or the CPU),
    threads, seeds; returns the framework's session. `comm`: an mpi4py communicator for Horovod."""
    from toolkit import config as _config
    from toolkit.run import pipeline as run

    return run.start(_config.load(config, **keys), comm)


def shards(path, split="train", ids=False):
    """Shards written by `toolkit shards` (a folder, or a glob/brace pattern of its training shards) for
    `session.loader(...)`: every sample once per epoch across the ranks, resumable mid-epoch and
    across a change of world. `split="eval"` for the held-out shards; `ids=True`: samples (x, y, id)."""
    from toolkit.data import streams

    return streams.shards(str(path), split, ids)
