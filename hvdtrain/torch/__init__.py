"""Drop-in replacement for horovod.torch (0.28): `import hvdtrain.torch as hvd`."""

from hvdtrain.core.horovod_api import *  # noqa: F401,F403 (Horovod's names shared by every framework)

from .compression import Compression
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm
from . import elastic  # noqa: E402 (hvd.elastic.run, hvd.elastic.TorchState, ...)
