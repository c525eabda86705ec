"""Averaging gradients over ranks: the reduction that DistributedGradientTape (gradients.py) and
the Keras DistributedOptimizer (keras/optimizer.py) share, and the helpers both need."""

import warnings
from dataclasses import dataclass
from typing import Sequence, Union

import tensorflow as tf

from hvdtrain import core
from hvdtrain.core import ProcessSet, global_process_set

from .collectives import Average, grouped_allreduce
from .compression import Compression


@dataclass(frozen=True)
class GradientReduction:
    """How gradients are combined over ranks. The gradients are reduced as one group (or as
    the explicit `groups`), named `<name>_<i>` after their position, so that every rank
    names them alike whatever its variables are called."""

    name: str
    compression: type = Compression.none
    sparse_as_dense: bool = False
    op: int = Average
    gradient_predivide_factor: float = 1.0
    groups: Union[None, int, Sequence[Sequence]] = None
    process_set: ProcessSet = global_process_set
    scale_local_gradients: bool = True

    def reduce(self, gradients, variables, local_refs=frozenset()):
        """The reduced `gradients` (None stays None); `variables` are what they belong to.
        Those of the variables in `local_refs` (their variable_key) are not reduced: each rank
        keeps its own, divided by the size with scale_local_gradients, as Horovod does. A rank
        outside the process set keeps all its own gradients, as in Horovod."""
        if not core.takes_part(self.process_set):
            return list(gradients)
        size = core.running_engine(self.process_set).size
        if size == 1:
            return list(gradients)
        local = [variable_key(v) in local_refs for v in variables]
        reduced = self._reduce_shared([None if is_local else g for g, is_local in zip(gradients, local)], variables)
        for i, gradient in enumerate(gradients):
            if local[i] and gradient is not None:
                reduced[i] = _divided(gradient, size) if self.scale_local_gradients else gradient
        return reduced

    def _reduce_shared(self, gradients, variables):
        gradients = [tf.convert_to_tensor(g) if self.sparse_as_dense and isinstance(g, tf.IndexedSlices) else g
                     for g in gradients]
        # For an average, Horovod splits the division by the size around the sum.
        prescale, postscale = ((1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor)
                               if self.op == Average else (1.0, 1.0))
        reduced = list(gradients)
        for number, members in enumerate(self._split([i for i, g in enumerate(gradients) if g is not None], variables)):
            name = self.name if self.groups is None else f"{self.name}.group{number}"
            results = grouped_allreduce([gradients[i] for i in members], compression=self.compression, op=self.op,
                                        prescale_factor=prescale, postscale_factor=postscale, name=name,
                                        process_set=self.process_set, ignore_name_scope=True)
            for i, result in zip(members, results):
                reduced[i] = result
        return reduced

    def _split(self, present, variables):
        """Positions of the gradients to reduce, in groups: one group; `groups` groups of
        consecutive gradients; or the variables' explicit groups, each other variable alone."""
        if self.groups is None:
            return [present] if present else []
        if isinstance(self.groups, int):
            count = min(self.groups, len(present))
            return [present[len(present) * g // count:len(present) * (g + 1) // count] for g in range(count)]
        group_of = {id(v): number for number, group in enumerate(self.groups) for v in group}
        explicit = [[] for _ in self.groups]
        alone = []
        for i in present:
            number = group_of.get(id(variables[i]))
            if number is None:
                alone.append([i])
            else:
                explicit[number].append(i)
        return [group for group in explicit if group] + alone


def optimizer_variables(optimizer):
    """An optimizer's variables: a method in tf-keras, a list in Keras 3."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def variable_key(variable):
    """What identifies a variable (or a watched tensor) in a set: its `.ref()`, as in Horovod;
    Keras 3's variables have none, so their identity."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def _divided(gradient, size):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / size, gradient.indices, gradient.dense_shape)
    return gradient / size


def gradient_reduction(name, compression=Compression.none, sparse_as_dense=False, op=Average,
                       gradient_predivide_factor=1.0, num_groups=0, groups=None, process_set=global_process_set,
                       scale_local_gradients=True):
    """A GradientReduction from Horovod's arguments, checked as Horovod checks them."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    return GradientReduction(name, compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set,
                             scale_local_gradients)


def local_layer_variables(local_layers):
    """The trainable variables of Horovod's `local_layers` argument (a layer or a list of them)."""
    if local_layers is None:
        return []
    if isinstance(local_layers, tf.keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, tf.keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return [variable for layer in local_layers for variable in layer.trainable_weights]
