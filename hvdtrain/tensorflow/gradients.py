"""DistributedGradientTape, and horovod.tensorflow's DistributedOptimizer, which wraps a Keras
optimizer as hvdtrain.tensorflow.keras does; both average gradients with reduction.py."""

import tensorflow as tf

from hvdtrain.core import global_process_set

from .collectives import Adasum, Average
from .compression import Compression
from .reduction import gradient_reduction, local_layer_variables, variable_key
from .session_training import AdasumDistributedOptimizer as SessionAdasumOptimizer
from .session_training import DistributedOptimizer as SessionDistributedOptimizer


class _DistributedGradient:
    """Placed before a tape's class: gradient() returns gradients reduced over ranks."""

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False, **kwargs):
        """tf.GradientTape.gradient, reduced over ranks. `use_generic_names` is accepted for
        Horovod's signature: gradients are always named after their position."""
        gradients = super().gradient(target, sources, output_gradients, **kwargs)
        reduced = self._hvdtrain_reduction.reduce(tf.nest.flatten(gradients), tf.nest.flatten(sources),
                                                  self._hvdtrain_local_sources)
        return tf.nest.pack_sequence_as(gradients, reduced)

    def register_local_source(self, source):
        """Keep this rank's own gradient for `source` (a variable or watched tensor): it is
        not reduced over ranks (but divided by the size with scale_local_gradients)."""
        self._hvdtrain_local_sources.add(variable_key(source))

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """gradient()'s (source, gradient) pairs, split into those of local sources and the others."""
        gradients = self.gradient(target, sources, output_gradients, use_generic_names)
        local, shared = [], []
        for source, gradient in zip(sources, gradients):
            (local if variable_key(source) in self._hvdtrain_local_sources else shared).append((source, gradient))
        return local, shared


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A tape like `gradtape` whose gradient() averages (or `op`-reduces) the gradients over
    ranks (of `process_set`), but those of sources given to register_local_source().
    `device_dense`/`device_sparse` are accepted for Horovod's signature."""
    reduction = gradient_reduction("DistributedGradientTape", compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    tape_class = type(gradtape)
    distributed_class = type(tape_class.__name__, (_DistributedGradient, tape_class), {})
    distributed = object.__new__(distributed_class)
    # Share the wrapped tape's state rather than copy it, so that a tape wrapped while still
    # recording stops recording for both when its `with` block ends.
    distributed.__dict__ = gradtape.__dict__
    distributed._hvdtrain_reduction = reduction
    distributed._hvdtrain_local_sources = set()
    return distributed


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose gradients of `local_layers`' trainable variables stay
    this rank's own (see register_local_source)."""
    local_variables = local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for variable in local_variables:
        tape.register_local_source(variable)
    return tape


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set):
    """Horovod's horovod.tensorflow.DistributedOptimizer: a TF1 optimizer (tf.compat.v1.train) is
    wrapped by session_training.py, a Keras optimizer by hvdtrain.tensorflow.keras's."""
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer) and op == Adasum:
        if process_set != global_process_set:
            raise NotImplementedError("Adasum does not support process sets yet")
        return SessionAdasumOptimizer(optimizer, name or f"DistributedDelta{type(optimizer).__name__}", compression,
                                      backward_passes_per_step, use_locking)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        reduction = gradient_reduction(name or f"Distributed{type(optimizer).__name__}", compression,
                                       sparse_as_dense, op, gradient_predivide_factor, num_groups, groups, process_set)
        return SessionDistributedOptimizer(optimizer, reduction, backward_passes_per_step,
                                           average_aggregated_gradients, use_locking)
    from .keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer  # Keras costs seconds to import

    return KerasDistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
        process_set=process_set)
