"""The Spark launcher (`--launcher spark [--master URL]`): the workers run as Spark tasks (local[N] without
--master), started by the driver toolkit/launch/sparkjob.py through `horovod.spark.run`, or pyspark's
TorchDistributor with --backend native. No elastic: Spark retries nothing."""
from __future__ import annotations

from toolkit.launch.launchers.engine import EngineLauncher


class Spark(EngineLauncher):
    name = "spark"
    title = "Spark"
    flags = {"master": "--master"}
    native = "TorchDistributor"
    driver = "toolkit.launch.sparkjob"
