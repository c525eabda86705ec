"""Horovod's TF1 training API, for graphs run by a tf.compat.v1.Session (MonitoredTrainingSession,
estimators): DistributedOptimizer around a tf.compat.v1.train.Optimizer (AdasumDistributedOptimizer
for op=Adasum), and BroadcastGlobalVariablesHook. The collectives under them are session_graphs.py's."""

import tensorflow as tf

from .collectives import Adasum, broadcast_variables, grouped_allreduce
from .reduction import GradientReduction


class _Wrapper(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer around another, whose slots and variables are the other's."""

    def __init__(self, optimizer, name, use_locking):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


class DistributedOptimizer(_Wrapper):
    """A tf.compat.v1.train.Optimizer whose compute_gradients() returns the gradients reduced
    over ranks, in one group (fused as eagerly), and whose apply_gradients() applies them; both
    of minimize(). With backward_passes_per_step = k, gradients are summed on each rank over
    k passes and reduced on the k-th, the only pass that applies them (the others count the
    global step, for schedules and hooks), as Horovod does."""

    def __init__(self, optimizer, reduction: GradientReduction, backward_passes_per_step=1,
                 average_aggregated_gradients=False, use_locking=False):
        super().__init__(optimizer, reduction.name, use_locking)
        self._reduction = reduction
        self._agg_helper = None
        if backward_passes_per_step > 1:
            if tf.executing_eagerly():
                raise ValueError("backward_passes_per_step > 1 is not yet supported for _LegacyOptimizer with eager "
                                 "execution.")
            self._agg_helper = _LocalAggregation(backward_passes_per_step, reduction, average_aggregated_gradients)

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        gradients = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if self._agg_helper is not None:
            reduced = self._agg_helper.compute_gradients(gradients, variables)
        else:
            reduced = self._reduction.reduce(gradients, variables)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        if self._agg_helper is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        return self._agg_helper.apply_gradients(
            lambda: self._optimizer.apply_gradients(grads_and_vars, global_step, name), grads_and_vars, global_step)


class AdasumDistributedOptimizer(_Wrapper):
    """Horovod's TF1 DistributedOptimizer(op=Adasum): every rank applies its own gradients with
    its own optimizer at each step, and on every backward_passes_per_step-th step the ranks
    combine, by Adasum, how far the weights moved since they last combined (Adasum weighs each
    rank's whole update, so the deltas are combined, not the gradients); then every rank's weights
    are the last combined ones plus that. Horovod 0.28.1's own class applies the gradients of its
    apply_gradients() with the wrapped optimizer alone, so its ranks never combine; this one does
    what Horovod's documents."""

    def __init__(self, optimizer, name, compression, backward_passes_per_step=1, use_locking=False):
        super().__init__(optimizer, name, use_locking)
        self._compression = compression
        self._passes = backward_passes_per_step

    def compute_gradients(self, *args, **kwargs):
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        with tf.compat.v1.variable_scope(self.get_name(), reuse=tf.compat.v1.AUTO_REUSE):
            steps = tf.compat.v1.get_variable("step_count", shape=(), dtype=tf.int64, trainable=False,
                                              initializer=tf.compat.v1.zeros_initializer(), collections=local)
            starts = [tf.compat.v1.get_variable(f"delta_start_{i}", shape=v.shape, dtype=v.dtype.base_dtype,
                                                trainable=False, initializer=tf.compat.v1.zeros_initializer(),
                                                collections=local) for i, v in enumerate(variables)]
        # The weights the first step starts from, which the broadcast of the initial state made
        # the same on every rank
        first = tf.cond(tf.equal(steps, 0), lambda: tf.group([s.assign(v) for s, v in zip(starts, variables)]),
                        tf.no_op)
        with tf.control_dependencies([first]):
            applied = self._optimizer.apply_gradients(grads_and_vars, global_step, name)

        def combine():
            deltas = [v.read_value() - s.read_value() for v, s in zip(variables, starts)]
            combined = grouped_allreduce(deltas, compression=self._compression, op=Adasum,
                                         name=f"{self.get_name()}.deltas")
            return tf.group([v.assign(s.assign_add(c)) for v, s, c in zip(variables, starts, combined)])

        with tf.control_dependencies([applied]):
            combined = tf.cond(tf.equal(steps % self._passes, self._passes - 1), combine, tf.no_op)
        with tf.control_dependencies([combined]):
            return steps.assign_add(1).op


class _LocalAggregation:
    """Gradients summed on this rank over backward_passes_per_step passes (Horovod's
    LocalGradientAggregationHelper, whose `counter` its users read): local variables, which
    MonitoredTrainingSession initializes (tf.compat.v1.local_variables_initializer otherwise)."""

    def __init__(self, passes, reduction, average_aggregated_gradients):
        self.passes = passes
        self.counter = None
        self._reduction = reduction
        self._average = average_aggregated_gradients

    def compute_gradients(self, gradients, variables):
        """Add the gradients to the sums; on the k-th pass, the sums reduced over ranks (and the
        sums and counter emptied); else the sums, which apply_gradients() will not apply."""
        present = [i for i, g in enumerate(gradients) if g is not None]
        local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        with tf.compat.v1.variable_scope(self._reduction.name, reuse=tf.compat.v1.AUTO_REUSE):
            self.counter = tf.compat.v1.get_variable("aggregation_counter", shape=(), dtype=tf.int32, trainable=False,
                                                     initializer=tf.compat.v1.zeros_initializer(), collections=local)
            sums = {i: tf.compat.v1.get_variable(f"aggregated_gradient_{i}", shape=variables[i].shape,
                                                 dtype=gradients[i].dtype, trainable=False,
                                                 initializer=tf.compat.v1.zeros_initializer(), collections=local)
                    for i in present}
        added = [sums[i].assign_add(tf.convert_to_tensor(gradients[i])) for i in present]
        with tf.control_dependencies(added):
            count = self.counter.assign_add(1)

        def reduce_sums():
            summed = [sums[i].read_value() if i in sums else None for i in range(len(gradients))]
            reduced = self._reduction.reduce(summed, variables)
            if self._average:
                reduced = [None if g is None else g / self.passes for g in reduced]
            reduced = [tf.convert_to_tensor(reduced[i]) for i in present]
            with tf.control_dependencies(reduced):
                emptied = [sums[i].assign(tf.zeros_like(sums[i])) for i in present] + [self.counter.assign(0)]
            with tf.control_dependencies(emptied):
                return [tf.identity(g) for g in reduced]

        def read_sums():
            return [sums[i].read_value() for i in present]

        results = tf.cond(tf.equal(count, self.passes), reduce_sums, read_sums)
        aggregated = [None] * len(gradients)
        for i, result in zip(present, results):
            aggregated[i] = result
        return aggregated

    def apply_gradients(self, apply, grads_and_vars, global_step):
        """apply() on the pass that reduced (the counter back at 0); else only the global step."""

        def count_the_step():
            if global_step is None:
                return tf.no_op()
            return tf.group(tf.compat.v1.assign_add(global_step, 1))

        gradients = [g for g, _ in grads_and_vars if g is not None]
        with tf.control_dependencies(gradients):
            return tf.cond(tf.equal(self.counter, 0), lambda: tf.group(apply()), count_the_step)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcast root_rank's global variables to every rank once the session is made (and made
    again after a failure), so that all ranks start alike from random or restored weights."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_variables(tf.compat.v1.global_variables(), self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)
