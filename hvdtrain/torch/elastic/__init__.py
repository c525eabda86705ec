"""`hvd.elastic` of horovod.torch: `run`, `TorchState`, `ObjectState` and `ElasticSampler`, kept by
restarts under `hvdtrun --host-discovery-script ...` (see hvdtrain/core/elastic.py for how and what
differs). Its modules are Horovod's, so that `from horovod.torch.elastic.sampler import
ElasticSampler` keeps working with `hvdtrain` for `horovod`."""

from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState, run

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]
