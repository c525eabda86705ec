"""Horovod on Ray without compiling: `from hvdtrain.ray import RayExecutor` where Horovod users
wrote `from horovod.ray import RayExecutor`."""

try:
    import ray  # noqa: F401
except ImportError:
    raise ImportError("hvdtrain.ray needs Ray: pip install 'hvdtrain[ray]'") from None

from hvdtrain.launch.relay import RankFailed
from hvdtrain.ray.executor import ElasticRayExecutor, ElasticRaySettings, RayExecutor, RaySettings

__all__ = ["RayExecutor", "RaySettings", "ElasticRayExecutor", "ElasticRaySettings", "RankFailed"]
