"""Horovod on Ray without compiling: `from hvdtrain.ray import RayExecutor` where Horovod users
wrote `from horovod.ray import RayExecutor`."""

from hvdtrain.ray.executor import RayExecutor, RaySettings
from hvdtrain.launch.relay import RankFailed

__all__ = ["RayExecutor", "RaySettings", "RankFailed"]
