"""Horovod on a Spark cluster from Python: `toolkit.spark.run(fn, config, np=..., master=..., spark=...)`.

`fn(config)` runs on `np` Horovod workers (one Spark task each, Gloo between them; `hvd.init()` in `fn` as
under horovodrun) and `run` returns each worker's result, by rank. `spark` is a SparkSession you already
have; without it the call makes one on `master` (spark://HOST:PORT; None: local[np]) and stops it after.
The workers' printed lines come back here tagged `[rank]<stdout>:`. `toolkit launch --launcher spark` runs
a command the same way (docs/CLUSTERS.md). pyspark is imported on the first call, not with this module.
"""
from toolkit.launch.sparkjob import run

__all__ = ["run"]
