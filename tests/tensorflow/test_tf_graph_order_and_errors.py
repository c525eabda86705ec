"""hvdtrain.tensorflow inside graphs and when ranks disagree, on 2 and 3 real ranks:
independent collectives in one tf.function, and in the backward function of a tf.function
differentiated outside it, finish (TensorFlow may start independent ops in any order; ours run
in the order they were built); a TF1 graph is refused when built; the errors are Horovod's
TensorFlow errors; gradients of local sources stay each rank's own."""

import numpy as np
import pytest

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "1"}


def ranks_graphs_and_errors():
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd

    hvd.init()
    for check in (check_independent_collectives_in_graphs, check_horovod_error_types, check_local_sources):
        check(tf, hvd)


def check_independent_collectives_in_graphs(tf, hvd):
    n, r = hvd.size(), hvd.rank()
    with tf.Graph().as_default():
        with pytest.raises(NotImplementedError, match="TF1 graph run by tf.compat.v1.Session.*inside tf.function"):
            hvd.allreduce(tf.constant(1.0))

    values = [tf.Variable(np.full(3, float(k + r))) for k in range(6)]

    @tf.function
    def independent():  # none of these depends on another
        return ([hvd.allreduce(v, op=hvd.Sum, name=f"independent.{k}") for k, v in enumerate(values)]
                + [hvd.allgather(values[0], name="independent.gather"),
                   hvd.broadcast(values[1], n - 1, name="independent.broadcast")])

    with tf.GradientTape() as tape:
        outputs = independent()
        loss = tf.add_n([tf.reduce_sum(output) * (k + 1) for k, output in enumerate(outputs)])
    # The backward function runs the outputs' gradient collectives, again independent.
    gradients = tape.gradient(loss, values)
    total = sum(range(n))
    for k in range(6):
        np.testing.assert_array_equal(outputs[k], np.full(3, float(n * k + total)))
    np.testing.assert_array_equal(outputs[6], np.concatenate([np.full(3, float(j)) for j in range(n)]))
    np.testing.assert_array_equal(outputs[7], np.full(3, float(1 + n - 1)))
    # Allreduce (Sum): the sum of the upstream k + 1; allgather: the mean of 7, this rank's
    # rows; broadcast: the mean of 8 on the root, 0 elsewhere.
    want = [n * (k + 1) + (7 if k == 0 else 8 * (r == n - 1) if k == 1 else 0) for k in range(6)]
    for gradient, expected in zip(gradients, want):
        np.testing.assert_array_equal(gradient, np.full(3, float(expected)))


def check_horovod_error_types(tf, hvd):
    """Ranks that disagree get tf.errors.FailedPreconditionError (eagerly; see
    hvdtrain.tensorflow.collectives), bad alltoall splits InvalidArgumentError, eagerly and in
    tf.function, as Horovod's ops raise them; then the job goes on."""
    n, r = hvd.size(), hvd.rank()
    disagreements = {
        "shape": lambda: hvd.allreduce(tf.zeros([r + 1]), name="disagree.shape"),
        "dtype": lambda: hvd.allreduce(tf.zeros([2], tf.float32 if r else tf.float64), name="disagree.dtype"),
        "rank": lambda: hvd.allgather(tf.zeros([2, 3] if r else [2, 3, 1]), name="disagree.rank"),
        "root": lambda: hvd.broadcast(tf.zeros([2]), root_rank=min(r, 1), name="disagree.root"),
    }
    for what, collective in disagreements.items():
        with pytest.raises(tf.errors.FailedPreconditionError, match=f"Mismatched .*disagree.{what}"):
            collective()
    for run in (lambda f: f(), lambda f: tf.function(f, autograph=False)()):
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"first dimension \({n + 1}\) must be divisible"):
            run(lambda: hvd.alltoall(tf.zeros([n + 1])))
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"splits must be {n} non-negative row counts"):
            run(lambda: hvd.alltoall(tf.zeros([n + 1]), splits=[1] * n))
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == n


def check_local_sources(tf, hvd):
    """register_local_source: that source's gradient is this rank's own, divided by the size
    unless scale_local_gradients=False; the others are averaged."""
    n, r = hvd.size(), hvd.rank()
    shared, own = tf.Variable([1.0, 1.0]), tf.Variable([1.0, 1.0])
    for scale in (True, False):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((shared + own) * (r + 1))
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
        tape.register_local_source(own)
        shared_gradient, own_gradient = tape.gradient(loss, [shared, own])
        np.testing.assert_allclose(shared_gradient, np.full(2, (n + 1) / 2))
        np.testing.assert_allclose(own_gradient, np.full(2, (r + 1) / n if scale else r + 1.0))


@pytest.mark.parametrize("ranks", [2, 3])
def test_graphs_and_errors(mpirun, ranks):
    mpirun(ranks, ranks_graphs_and_errors, timeout=180, env=QUIET)
