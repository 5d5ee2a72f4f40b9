"""Where this process sits in the job, and a digest of a model's bits (framework-free)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: str          # "cpu" or "cuda:0", "gpu(1)", ... as the framework names it
    replicas: int = 1    # model replicas this process drives (several only under TF's native strategies)

    @property
    def world_size(self) -> int:
        """Data-parallel replicas in the job: what batch sizes, sharding and lr scaling count."""
        return self.size * self.replicas


def digest(arrays) -> str:
    """sha256 of the parameters' bytes: equal on two ranks only if every bit is equal."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes())
    return h.hexdigest()[:16]
