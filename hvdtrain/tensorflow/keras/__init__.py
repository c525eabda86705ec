"""Drop-in replacement for horovod.tensorflow.keras (0.28): `import hvdtrain.keras as hvd`, or
`import hvdtrain.tensorflow.keras as hvd` (the same module).

Serves both Keras generations with one implementation: Keras 3 (TensorFlow 2.21's default)
and tf-keras (Keras 2, selected with TF_USE_LEGACY_KERAS=1), whichever Keras `tf.keras` is.
"""

import tensorflow as tf

from hvdtrain import tensorflow as _hvd
from hvdtrain.core.horovod_api import *  # noqa: F401,F403 (Horovod's names shared by every framework)
from hvdtrain.tensorflow import (  # noqa: F401 (re-exported)
    Compression,
    broadcast_variables,
)

from . import callbacks, elastic
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model  # noqa: F401 (re-exported)


def broadcast_global_variables(root_rank, model=None):
    """Give every rank root_rank's values of `model`'s variables and its optimizer's.

    TensorFlow 2 has no collection of global variables, so Horovod's form without a model
    cannot work (Horovod raises too); pass the model, or use BroadcastGlobalVariablesCallback."""
    if model is None:
        raise RuntimeError("broadcast_global_variables needs the model in TensorFlow 2, which keeps no global "
                           "variables: call broadcast_global_variables(root_rank, model=model), "
                           "hvd.broadcast_variables(variables, root_rank), or use BroadcastGlobalVariablesCallback")
    broadcast_variables(callbacks.model_and_optimizer_variables(model), root_rank)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """The reduction over ranks of a tensor-compatible value (default: the average)."""
    return _hvd.allreduce(tf.constant(value), average=average, compression=compression, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name)


def allgather(value, name=None):
    """Every rank's tensor-compatible value, concatenated along the first dimension."""
    return _hvd.allgather(tf.constant(value), name=name)


def broadcast(value, root_rank, name=None):
    """root_rank's tensor-compatible value, on every rank."""
    return _hvd.broadcast(tf.constant(value), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """The reduction over ranks of a tensor-compatible value, this rank's share of its rows."""
    return _hvd.reducescatter(tf.constant(value), op=op, name=name)
