"""Drop-in replacement for horovod.tensorflow (0.28) on TensorFlow 2: `import hvdtrain.tensorflow as hvd`.

Eager mode, tf.function and TF1 graphs run by a tf.compat.v1.Session (MonitoredTrainingSession,
tf.compat.v1.train optimizers, BroadcastGlobalVariablesHook) are supported. `hvd.SyncBatchNormalization`
and `hvdtrain.tensorflow.keras` (also `hvdtrain.keras`) import Keras on first use.
"""

from hvdtrain.core.horovod_api import *  # noqa: F401,F403 (Horovod's names shared by every framework)

from .collectives import (  # noqa: F401 (re-exported)
    allgather,
    allgather_object,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
    cross_rank_op,
    cross_size_op,
    gpu_available,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    handle_average_backwards_compatibility,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    size_op,
)
from .compression import Compression  # noqa: F401 (re-exported)
from .gradients import (  # noqa: F401 (re-exported)
    DistributedGradientTape,
    DistributedOptimizer,
    PartialDistributedGradientTape,
)
from .session_training import BroadcastGlobalVariablesHook  # noqa: F401 (re-exported)

def __getattr__(name):
    # Keras costs seconds to import; only SyncBatchNormalization needs it.
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

from . import elastic  # noqa: E402 (hvd.elastic.run, hvd.elastic.TensorFlowKerasState, ...)
