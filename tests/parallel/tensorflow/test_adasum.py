"""hvdtrain.tensorflow with op=Adasum on 2 real ranks (the core and torch tests take 4 too,
where TensorFlow's start on 2 cores would cost more than it adds): allreduce, alone and grouped,
eagerly and in tf.function, gives Adasum's tree; DistributedGradientTape(op=Adasum) combines the
ranks' gradients so; the TF1 DistributedOptimizer(op=Adasum) in a session applies each rank's own
gradients and, every backward_passes_per_step-th step, sets every rank's weights to the last
combined ones plus the Adasum of the ranks' moves since, as a replay in NumPy computes; what
Horovod refuses with Adasum is refused; and hvd.gpu_available, which Horovod's Adasum tests
call. The engine's Adasum itself is tested in tests/parallel/core/test_adasum.py."""

import numpy as np
import pytest
from support.adasum import adasum_reference

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "1"}
LR, BATCH, STEPS = 0.125, 3, 4  # a learning rate exact in float32, as TF1 optimizers hold it


def _started():
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd

    hvd.init()
    return tf, hvd


def _inputs(rank, shape, salt):
    common = np.random.default_rng(salt).standard_normal(shape)
    return common + np.random.default_rng(100 * salt + rank).standard_normal(shape)


def allreduce_gives_adasums_tree_alone_grouped_eagerly_and_in_tf_function():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    shapes = [(5,), (2, 3)]
    inputs = [[_inputs(k, shape, salt) for k in range(n)] for salt, shape in enumerate(shapes)]
    expected = [adasum_reference([x.reshape(-1) for x in per_rank]).reshape(shape)
                for per_rank, shape in zip(inputs, shapes)]
    mine = [tf.constant(per_rank[r]) for per_rank in inputs]

    def reduce():
        return [hvd.allreduce(t, op=hvd.Adasum) for t in mine] + hvd.grouped_allreduce(mine, op=hvd.Adasum)

    for got in (reduce(), tf.function(reduce)()):
        for value, want in zip(got, expected + expected):
            np.testing.assert_allclose(value.numpy(), want, rtol=1e-12)
    hvd.shutdown()


def the_tape_combines_the_ranks_gradients_by_adasum():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    weights = tf.Variable(np.ones(4))
    scales = [_inputs(k, (4,), 9) for k in range(n)]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(weights * scales[r])
    gradient = hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [weights])[0]
    np.testing.assert_allclose(gradient.numpy(), adasum_reference(scales), rtol=1e-12)
    hvd.shutdown()


def _batch(rank, step):
    generator = np.random.default_rng(10 * step + rank)
    return generator.standard_normal((BATCH, 3)), generator.standard_normal((BATCH, 1))


def _replayed(world_size, passes, initial):
    """Plain gradient descent on each rank's own batches of a linear model, the moves since the
    last combination combined by Adasum every `passes` steps."""
    start = initial.copy()
    weights = [initial.copy() for _ in range(world_size)]
    for step in range(STEPS):
        for rank in range(world_size):
            x, y = _batch(rank, step)
            weights[rank] -= LR * 2 / BATCH * x.T @ (x @ weights[rank] - y)
        if step % passes == passes - 1:
            start = start + adasum_reference([(w - start).reshape(-1) for w in weights]).reshape(start.shape)
            weights = [start.copy() for _ in range(world_size)]
    return weights


def _tf1_adasum_trains_as_replayed(passes):
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    initial = np.random.default_rng(3).standard_normal((3, 1))
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float64, [None, 3])
        y = tf.compat.v1.placeholder(tf.float64, [None, 1])
        w = tf.compat.v1.get_variable("w", initializer=initial)
        loss = tf.reduce_mean((x @ w - y) ** 2)
        optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), op=hvd.Adasum,
                                             backward_passes_per_step=passes)
        train_op = optimizer.minimize(loss)
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as session:
            session.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for step in range(STEPS):
                features, targets = _batch(r, step)
                session.run(train_op, {x: features, y: targets})
            got = session.run(w)
    np.testing.assert_allclose(got, _replayed(n, passes, initial)[r], rtol=1e-12)
    hvd.shutdown()


def a_tf1_optimizer_combines_each_step():
    _tf1_adasum_trains_as_replayed(passes=1)


def a_tf1_optimizer_combines_every_second_step_and_steps_alone_between():
    _tf1_adasum_trains_as_replayed(passes=2)


def what_horovod_refuses_with_adasum_is_refused():
    tf, hvd = _started()
    slices = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]), tf.constant([3, 2]))
    with pytest.raises(NotImplementedError, match="Adasum reduction does not currently support sparse tensors"):
        hvd.allreduce(slices, op=hvd.Adasum)
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with pytest.raises(ValueError, match="Adasum does not support average_aggregated_gradients"):
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum, average_aggregated_gradients=True)
    with pytest.raises(NotImplementedError, match="Adasum does not support process sets"):
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum, process_set=hvd.ProcessSet(range(hvd.size())))
    hvd.shutdown()


def gpu_available_says_whether_the_framework_sees_a_gpu():
    """Horovod's helper, which its Adasum tests call to choose their device."""
    tf, hvd = _started()
    assert hvd.gpu_available("tensorflow") is bool(tf.config.list_physical_devices("GPU"))
    assert hvd.gpu_available("mxnet") is False
    hvd.shutdown()


CHECKS = [allreduce_gives_adasums_tree_alone_grouped_eagerly_and_in_tf_function,
          the_tape_combines_the_ranks_gradients_by_adasum, a_tf1_optimizer_combines_each_step,
          a_tf1_optimizer_combines_every_second_step_and_steps_alone_between,
          what_horovod_refuses_with_adasum_is_refused, gpu_available_says_whether_the_framework_sees_a_gpu]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_adasum(ranks, check):
    ranks.run(2, CHECKS, env=QUIET, timeout=300).assert_passed(check)
