"""The Ray launcher (`--launcher ray [--address ADDR|auto]`): the workers run on a Ray cluster (a local one for
the job without --address), started by the driver toolkit/launch/rayjob.py; elastic is Horovod's elastic Ray
executor (Ray finds the hosts), --backend native Ray Train's TorchTrainer."""
from __future__ import annotations

from toolkit.errors import ToolkitError
from toolkit.launch.launchers.engine import EngineLauncher


class Ray(EngineLauncher):
    name = "ray"
    title = "Ray"
    flags = {"address": "--address"}
    native = "Ray Train TorchTrainer"
    driver = "toolkit.launch.rayjob"
    elastic = True

    def check(self, spec) -> None:
        super().check(spec)
        if spec.elastic and (spec.discovery is not None or spec.backend == "native"):
            raise ToolkitError("elastic on Ray is Horovod's elastic Ray executor: Ray finds the hosts (drop "
                               "--host-discovery-script) and it runs the horovod backend (drop --backend native)")
