"""DistributedOptimizer for Keras optimizers, Keras 3 and tf-keras (Keras 2) alike.

The wrapper is a subclass of the optimizer's own class, made on the fly and named like it,
so that a model saved with it loads without hvdtrain. Gradients are reduced at the one
door each Keras generation sends every update through: `apply()` in Keras 3 (model.fit and
apply_gradients both call it), `apply_gradients()` in tf-keras (model.fit and minimize both
call it). With backward_passes_per_step = k, each call adds its gradients to local sums;
every k-th call reduces the sums over ranks and applies them, the others only count the
iteration, as Horovod does.
"""

from dataclasses import dataclass
from typing import List, Optional

import tensorflow as tf

from hvdtrain.core import global_process_set
from hvdtrain.tensorflow.collectives import Average, Sum
from hvdtrain.tensorflow.compression import Compression
from hvdtrain.tensorflow.gradients import GradientReduction, gradient_reduction


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set):
    """An optimizer like `optimizer` (a new instance from its config) that averages (or sums,
    `op=Sum`) gradients over ranks (of `process_set`) before applying them. `device_dense`/`device_sparse` are
    accepted for Horovod's signature."""
    if not (hasattr(optimizer, "get_config") and hasattr(type(optimizer), "from_config")):
        raise TypeError(f"DistributedOptimizer expects a Keras optimizer, got {type(optimizer).__name__}")
    if op not in (Average, Sum):
        raise ValueError("op currently only supports Average and Sum")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
    base = type(optimizer)
    settings = _Settings(
        gradient_reduction(name or f"Distributed{base.__name__}", compression, sparse_as_dense, op,
                           gradient_predivide_factor, num_groups, groups, process_set),
        backward_passes_per_step, average_aggregated_gradients)
    return _distributed_class(base, settings).from_config(optimizer.get_config())


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """Load a compiled Keras model saved with `model.save` (by a DistributedOptimizer or any
    other), its optimizer made a DistributedOptimizer that keeps the saved state (iterations,
    slots), so that training resumes where it stopped. `custom_optimizers`: optimizer classes
    of your own that the file names."""
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = tf.keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError(f"load_model: {filepath} holds a model saved without an optimizer (it was not compiled); "
                         "load it with tf.keras.models.load_model and compile it with a DistributedOptimizer")
    base = type(optimizer)
    settings = _Settings(gradient_reduction(f"Distributed{base.__name__}", compression, False, Average, 1.0, 0, None,
                                            global_process_set), 1, False)
    # The loaded instance holds the saved state: it becomes distributed in place, since the
    # distributed class only adds methods to its own class.
    optimizer.__class__ = _distributed_class(base, settings)
    return model


def _distributed_class(base, settings):
    """A subclass of the optimizer class `base`, named like it (a model saved with it loads
    without hvdtrain), that reduces gradients as `settings` say before applying them."""
    updates = _Keras3Updates if _is_keras3(base) else _Keras2Updates
    return type(base.__name__, (updates, base), {"__module__": base.__module__, "_hvdtrain": settings})


@dataclass(frozen=True)
class _Settings:
    reduction: GradientReduction
    backward_passes_per_step: int
    average_aggregated_gradients: bool


@dataclass
class _LocalSums:
    """Gradients summed on this rank between two reductions (backward_passes_per_step > 1)."""

    passes: tf.Variable
    sums: List[Optional[tf.Variable]]


def _is_keras3(optimizer_class):
    return any(c.__module__.split(".")[0] == "keras" for c in optimizer_class.__mro__)


class _Keras3Updates:
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None and not self.built:
            return super().apply(grads)  # Keras explains that it needs the variables
        variables = self._trainable_variables if trainable_variables is None else list(trainable_variables)
        if not self.built:  # as model.fit does; the slots must not be made inside tf.cond
            self.build(variables)
        parent_apply = super().apply
        return _reduce_and_apply(self, list(grads), variables, lambda reduced: parent_apply(reduced, variables))


class _Keras2Updates:
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        parent_apply_gradients = super().apply_gradients
        return _reduce_and_apply(self, grads, variables,
                                 lambda reduced: parent_apply_gradients(list(zip(reduced, variables)), *args, **kwargs))


def _reduce_and_apply(optimizer, gradients, variables, apply):
    settings = optimizer._hvdtrain
    passes = settings.backward_passes_per_step
    if passes == 1:
        return apply(settings.reduction.reduce(gradients, variables))

    local = _local_sums(optimizer, gradients, variables)
    for total, gradient in zip(local.sums, gradients):
        if gradient is not None:
            total.assign_add(tf.convert_to_tensor(gradient))
    local.passes.assign_add(1)

    def reduce_and_apply():
        summed = [None if total is None else total.read_value() for total in local.sums]
        reduced = settings.reduction.reduce(summed, variables)
        if settings.average_aggregated_gradients:
            reduced = [None if g is None else g / passes for g in reduced]
        apply(reduced)
        for total in local.sums:
            if total is not None:
                total.assign(tf.zeros_like(total))
        local.passes.assign(0)

    def count_iteration():
        optimizer.iterations.assign_add(1)

    tf.cond(local.passes >= passes, reduce_and_apply, count_iteration)
    return optimizer.iterations


def _local_sums(optimizer, gradients, variables):
    local = getattr(optimizer, "_hvdtrain_local_sums", None)
    if local is None:
        # Made eagerly even while a tf.function traces, like Keras makes optimizer slots.
        with tf.init_scope():
            local = _LocalSums(
                tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdtrain_backward_passes"),
                [None if g is None else tf.Variable(tf.zeros(v.shape, g.dtype), trainable=False,
                                                    name="hvdtrain_gradient_sum")
                 for g, v in zip(gradients, variables)])
        optimizer._hvdtrain_local_sums = local
    return local
