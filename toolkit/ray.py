"""`toolkit.ray.run(fn, config, np=N, address=...)`: `fn(config)` on N Horovod workers of a Ray cluster.

For a notebook or a Ray job: connects to the cluster at `address` (or the one this process is connected
to; neither: a local Ray for the call, stopped after it), starts N workers with Horovod's RayExecutor
(one actor each, `cpus_per_worker`/`gpus_per_worker` reserved), runs `fn(config)` in each (it calls
`toolkit.start(...)`, or `hvd.init()` itself) and returns the results by rank. The command-line form
is `toolkit launch --launcher ray` (docs/CLUSTERS.md). `import toolkit` does not import this module or Ray.
"""
from toolkit.launch.rayjob import run

__all__ = ["run"]
