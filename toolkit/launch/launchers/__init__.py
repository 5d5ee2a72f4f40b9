"""Every way `toolkit launch` starts the ranks, by the name --launcher takes: one module each in this folder,
behind the interface in base.py. A new launcher is one module and one row below."""
from toolkit.launch.launchers import horovodrun, mpirun, ray, spark, tf_config, torchrun
from toolkit.launch.launchers.base import Launcher

LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher for launcher in (
    horovodrun.Horovodrun(),
    mpirun.Mpirun(),
    tf_config.TfConfig(),
    torchrun.Torchrun(),
    ray.Ray(),
    spark.Spark(),
)}
