"""DistributedOptimizer for Keras optimizers, Keras 3 and tf-keras (Keras 2) alike.

The wrapper is a subclass of the optimizer's own class, made on the fly and named like it,
so that a model saved with it loads without hvdtrain. Gradients are reduced at the one
door each Keras generation sends every update through: `apply()` in Keras 3 (model.fit and
apply_gradients both call it), `apply_gradients()` in tf-keras. In tf-keras, as in Horovod,
`compute_gradients()` / `_compute_gradients()` (which minimize() and model.fit call) already
return the reduced gradients, and the apply_gradients() after them only applies them.
With backward_passes_per_step = k, each pass adds its gradients to local sums; every k-th
reduces the sums over ranks and applies them, the others only count the iteration, as
Horovod does. Gradients of variables given to register_local_var() are not reduced.
"""

from dataclasses import dataclass
from typing import List, Optional

import tensorflow as tf

from hvdtrain.core import global_process_set
from hvdtrain.tensorflow.collectives import Average, Sum
from hvdtrain.tensorflow.compression import Compression
from hvdtrain.tensorflow.reduction import (GradientReduction, gradient_reduction, local_layer_variables,
                                          variable_key)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """An optimizer like `optimizer` (a new instance from its config) that averages (or sums,
    `op=Sum`) gradients over ranks (of `process_set`) before applying them, but those of the
    variables given to its register_local_var(). `device_dense`/`device_sparse` are
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
                           gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients),
        backward_passes_per_step, average_aggregated_gradients)
    return _distributed_class(base, settings).from_config(optimizer.get_config())


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                                sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, groups=None,
                                process_set=global_process_set, local_layers=None, scale_local_gradients=True):
    """DistributedOptimizer whose gradients of `local_layers`' trainable variables stay this
    rank's own (see register_local_var)."""
    local_variables = local_layer_variables(local_layers)
    distributed = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                       gradient_predivide_factor, op, groups=groups, process_set=process_set,
                                       scale_local_gradients=scale_local_gradients)
    for variable in local_variables:
        distributed.register_local_var(variable)
    return distributed


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
    """Gradients summed on this rank between two reductions (backward_passes_per_step > 1), and
    the passes counted since the last."""

    counter: tf.Variable
    sums: List[Optional[tf.Variable]]


def _is_keras3(optimizer_class):
    return any(c.__module__.split(".")[0] == "keras" for c in optimizer_class.__mro__)


class _LocalVariables:
    @property
    def _agg_helper(self):
        """The local sums under Horovod's name (its users read `_agg_helper.counter`): None with
        backward_passes_per_step = 1, and until the first pass."""
        return getattr(self, "_hvdtrain_local_sums", None)

    def register_local_var(self, var):
        """Keep this rank's own gradient for `var`: it is not reduced over ranks (but divided
        by the size with scale_local_gradients)."""
        # Past Keras's attribute tracking: a set of references is no state to save.
        self.__dict__.setdefault("_hvdtrain_local_refs", set()).add(variable_key(var))


class _Keras3Updates(_LocalVariables):
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None and not self.built:
            return super().apply(grads)  # Keras explains that it needs the variables
        variables = self._trainable_variables if trainable_variables is None else list(trainable_variables)
        if not self.built:  # as model.fit does; the slots must not be made inside tf.cond
            self.build(variables)
        parent_apply = super().apply
        reduced = _reduce(self, list(grads), variables)
        return _apply_or_count(self, lambda: parent_apply(reduced, variables))


class _Keras2Updates(_LocalVariables):
    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, tape=tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """The gradients reduced over ranks (Horovod's DistributedOptimizer: minimize and
        model.fit come here), for the apply_gradients() that follows to apply as they are."""
        base = super()
        if hasattr(base, "_compute_gradients"):  # tf-keras's legacy optimizers
            grads_and_vars = base._compute_gradients(loss, var_list, grad_loss, tape=tape)
        else:
            grads_and_vars = base.compute_gradients(loss, var_list, tape)
        variables = [v for _, v in grads_and_vars]
        reduced = _reduce(self, [g for g, _ in grads_and_vars], variables)
        self.__dict__["_hvdtrain_computed_reduced"] = True
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if not self.__dict__.pop("_hvdtrain_computed_reduced", False):
            grads = _reduce(self, grads, variables)
        parent_apply_gradients = super().apply_gradients
        return _apply_or_count(self, lambda: parent_apply_gradients(list(zip(grads, variables)), *args, **kwargs))


def _reduce(optimizer, gradients, variables):
    """The gradients to apply: reduced over ranks; with backward_passes_per_step = k, added to
    the local sums, which every k-th pass reduces (and empties) and the others return."""
    settings = optimizer._hvdtrain
    local_refs = optimizer.__dict__.get("_hvdtrain_local_refs", frozenset())
    passes = settings.backward_passes_per_step
    if passes == 1:
        return settings.reduction.reduce(gradients, variables, local_refs)

    local = _local_sums(optimizer, gradients, variables)
    for total, gradient in zip(local.sums, gradients):
        if gradient is not None:
            total.assign_add(tf.convert_to_tensor(gradient))
    local.counter.assign_add(1)
    present = [i for i, total in enumerate(local.sums) if total is not None]

    def reduce_sums():
        summed = [None if total is None else total.read_value() for total in local.sums]
        reduced = settings.reduction.reduce(summed, variables, local_refs)
        if settings.average_aggregated_gradients:
            reduced = [None if g is None else g / passes for g in reduced]
        reduced = [tf.convert_to_tensor(reduced[i]) for i in present]
        with tf.control_dependencies(reduced):
            for i in present:
                local.sums[i].assign(tf.zeros_like(local.sums[i]))
            local.counter.assign(0)
        return reduced

    def read_sums():
        return [local.sums[i].read_value() for i in present]

    results = tf.cond(local.counter >= passes, reduce_sums, read_sums)
    gradients = [None] * len(local.sums)
    for i, result in zip(present, results):
        gradients[i] = result
    return gradients


def _apply_or_count(optimizer, apply):
    """Apply on the passes that reduced (all with backward_passes_per_step = 1); on the
    others only count the iteration, as Horovod does."""
    if optimizer._hvdtrain.backward_passes_per_step == 1:
        return apply()

    def apply_update():  # its result would have to match count_iteration's in a graph
        apply()

    def count_iteration():
        optimizer.iterations.assign_add(1)

    tf.cond(optimizer._hvdtrain_local_sums.counter == 0, apply_update, count_iteration)
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
