"""hvdtrain.tensorflow on real ranks: exact collectives on tf.Tensors of several dtypes, eagerly
and inside tf.function; their gradients; errors on every rank for mismatched shapes; and
DistributedGradientTape giving the weights of one process with the whole batch; the same
within a process set of two of the three ranks.

TensorFlow takes seconds to import, so each launch runs all of these checks."""

import numpy as np
import pytest

GATHERED_DTYPES = ["float32", "int64", "bool", "float16"]
EXACT_DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"]
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "1"}  # TensorFlow's INFO lines would bury a failure's output
FLOAT_TOLERANCE = {"float32": 1e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}


def ranks_tensorflow_api():
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd

    ends = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[ends])
    for check in (check_reductions, check_data_movement, check_sparse_objects_and_join, check_gradients,
                  check_mismatched_shapes_fail_everywhere, check_gradient_tape_equivalence):
        check(tf, hvd)
    check_process_set(tf, hvd, ends)


def _values(rank, dtype, shape=(2, 3)):
    """Small integers, so that sums and products are exact in every dtype."""
    import ml_dtypes

    numpy_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return (np.arange(int(np.prod(shape))).reshape(shape) % 4 + rank + 1).astype(numpy_dtype)


def _assert_in_both_modes(tf, compute, check):
    """`check(results)` for `compute()` run eagerly and traced by tf.function."""
    check({key: np.asarray(value) for key, value in compute().items()})
    check({key: np.asarray(value) for key, value in tf.function(compute)().items()})


def check_reductions(tf, hvd):
    n, r = hvd.size(), hvd.rank()
    every = {dtype: np.stack([_values(k, dtype).astype(np.float64) for k in range(n)]) for dtype in EXACT_DTYPES}
    ops = {"sum": hvd.Sum, "min": hvd.Min, "max": hvd.Max, "product": hvd.Product, "average": hvd.Average}
    expected = {"sum": np.sum, "min": np.min, "max": np.max, "product": np.prod, "average": np.mean}

    def compute():
        results = {}
        for dtype in EXACT_DTYPES:
            x = tf.constant(_values(r, dtype))
            for op_name, op in ops.items():
                if op_name == "average" and dtype not in FLOAT_TOLERANCE:
                    continue
                results[f"{dtype}/{op_name}"] = hvd.allreduce(x, op=op)
        x = tf.constant(_values(r, "float64"))
        results["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.25)
        results["fp16"] = hvd.allreduce(tf.constant(_values(r, "float32")), op=hvd.Sum,
                                        compression=hvd.Compression.fp16)
        results["grouped_a"], results["grouped_b"] = hvd.grouped_allreduce(
            [tf.constant(_values(r, "float32")), tf.constant(_values(r, "int64", (5,)))], op=hvd.Sum)
        return results

    def check(results):
        for key, result in results.items():
            if "/" in key:
                dtype, op_name = key.split("/")
                assert result.dtype.name == dtype, (key, result.dtype)
                want = expected[op_name](every[dtype], axis=0)
                if op_name == "average":
                    np.testing.assert_allclose(result.astype(np.float64), want, rtol=FLOAT_TOLERANCE[dtype])
                else:
                    np.testing.assert_array_equal(result.astype(np.float64), want, err_msg=str(key))
        np.testing.assert_array_equal(results["scaled"], 0.75 * every["float64"].sum(axis=0))
        assert results["fp16"].dtype == np.float32
        np.testing.assert_array_equal(results["fp16"], every["float32"].sum(axis=0))
        np.testing.assert_array_equal(results["grouped_a"], every["float32"].sum(axis=0))
        np.testing.assert_array_equal(results["grouped_b"], sum(_values(k, "int64", (5,)) for k in range(n)))

    _assert_in_both_modes(tf, compute, check)


def check_data_movement(tf, hvd):
    """allgather with a ragged first dimension, broadcast, alltoall and reducescatter."""
    n, r = hvd.size(), hvd.rank()
    root = n - 1

    def rows(rank, dtype):
        return (np.arange((rank + 1) * 2).reshape(rank + 1, 2) + 10 * rank).astype(dtype)

    splits = [j + r + 1 for j in range(n)]
    to_send = np.concatenate([np.full((s, 2), 100 * r + j, np.int32) for j, s in enumerate(splits)])
    scatter_input = np.arange((2 * n + 1) * 3, dtype=np.float64).reshape(2 * n + 1, 3) * (r + 1)

    def compute():
        results = {f"gather_{d}": hvd.allgather(tf.constant(rows(r, d))) for d in GATHERED_DTYPES}
        results["gather_a"], results["gather_b"] = hvd.grouped_allgather(
            [tf.constant(rows(r, "float64")), tf.constant(rows(r, "int32")[:, :1])])
        for dtype in ("float64", "int32", "bool"):
            results[f"broadcast_{dtype}"] = hvd.broadcast(tf.constant(_values(r, "int32").astype(dtype)), root)
        results["alltoall"], results["received_splits"] = hvd.alltoall(tf.constant(to_send), splits=splits)
        results["alltoall_even"] = hvd.alltoall(tf.constant(np.full((2 * n, 1), r, np.int64)))
        results["scatter_sum"] = hvd.reducescatter(tf.constant(scatter_input), op=hvd.Sum)
        results["scatter_average"] = hvd.reducescatter(tf.constant(scatter_input), op=hvd.Average)
        return results

    total = sum(np.arange((2 * n + 1) * 3, dtype=np.float64).reshape(2 * n + 1, 3) * (k + 1) for k in range(n))
    mine = slice(sum(2 + (k < 1) for k in range(r)), sum(2 + (k < 1) for k in range(r + 1)))

    def check(results):
        for dtype in GATHERED_DTYPES:
            want = np.concatenate([rows(k, dtype) for k in range(n)])
            np.testing.assert_array_equal(results[f"gather_{dtype}"], want)
            assert results[f"gather_{dtype}"].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(results["gather_a"], np.concatenate([rows(k, "float64") for k in range(n)]))
        np.testing.assert_array_equal(results["gather_b"], np.concatenate([rows(k, "int32")[:, :1] for k in range(n)]))
        for dtype in ("float64", "int32", "bool"):
            np.testing.assert_array_equal(results[f"broadcast_{dtype}"], _values(root, "int32").astype(dtype))
        np.testing.assert_array_equal(results["received_splits"], [r + s + 1 for s in range(n)])
        np.testing.assert_array_equal(
            results["alltoall"], np.concatenate([np.full((r + s + 1, 2), 100 * s + r, np.int32) for s in range(n)]))
        np.testing.assert_array_equal(results["alltoall_even"], np.repeat(np.arange(n), 2).reshape(2 * n, 1))
        np.testing.assert_array_equal(results["scatter_sum"], total[mine])
        np.testing.assert_allclose(results["scatter_average"], total[mine] / n, rtol=1e-15)

    _assert_in_both_modes(tf, compute, check)


def check_sparse_objects_and_join(tf, hvd):
    n, r = hvd.size(), hvd.rank()

    def slices(rank):
        values, indices = np.full((rank + 1, 3), rank + 1.0), np.arange(rank + 1) + rank
        return tf.IndexedSlices(tf.constant(values), tf.constant(indices),
                                dense_shape=tf.constant([2 * n, 3]))

    reduced = hvd.allreduce(slices(r), op=hvd.Average)
    assert isinstance(reduced, tf.IndexedSlices)
    want = sum(np.asarray(tf.convert_to_tensor(slices(k))) for k in range(n)) / n
    np.testing.assert_allclose(np.asarray(tf.convert_to_tensor(reduced)), want, rtol=1e-15)

    assert hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1) == {"from": n - 1, "list": [n - 1] * 3}
    assert hvd.allgather_object("x" * r) == ["x" * k for k in range(n)]
    last = int(hvd.join())
    assert 0 <= last < n and hvd.allgather_object(last) == [last] * n


def check_gradients(tf, hvd):
    """Horovod's gradients: allreduce reduces the incoming gradients with the same op;
    allgather averages them and keeps this rank's rows; broadcast averages them on the root
    and gives zeros elsewhere; alltoall sends them back; reducescatter allgathers them times
    its scale factors, and times the size for Sum."""
    n, r = hvd.size(), hvd.rank()
    weights = [np.arange(6.0).reshape(3, 2) + k for k in range(n)]  # rank k's upstream gradient
    gathered_weights = [np.arange((n * (n + 1) // 2) * 2.0).reshape(-1, 2) * (k + 1) for k in range(n)]
    received_rows = [sum(k + s + 1 for s in range(n)) for k in range(n)]  # rank k gets k+s+1 rows from rank s
    exchanged_weights = [np.arange(rows * 2.0).reshape(-1, 2) + 0.5 * k for k, rows in enumerate(received_rows)]
    scattered_weights = [np.full((3 if k == 0 else 2, 3), k + 1.0) for k in range(n)]  # 2n+1 rows, split

    def compute():
        x = tf.constant(np.arange(6.0).reshape(3, 2) * (r + 1))
        rows = tf.constant(np.ones((r + 1, 2)))
        to_send = tf.constant(np.ones((sum(j + r + 1 for j in range(n)), 2)))
        to_scatter = tf.constant(np.ones((2 * n + 1, 3)))
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, rows, to_send, to_scatter])
            summed = tf.reduce_sum(weights[r] * hvd.allreduce(x, op=hvd.Sum))
            averaged = tf.reduce_sum(weights[r] * hvd.allreduce(x, op=hvd.Average))
            gathered = tf.reduce_sum(gathered_weights[r] * hvd.allgather(rows))
            broadcast = tf.reduce_sum(weights[r] * hvd.broadcast(x, 0))
            received, _ = hvd.alltoall(to_send, splits=[j + r + 1 for j in range(n)])
            exchanged = tf.reduce_sum(exchanged_weights[r] * received)
            scattered = tf.reduce_sum(scattered_weights[r] * hvd.reducescatter(to_scatter, op=hvd.Sum))
            scaled = tf.reduce_sum(scattered_weights[r] * hvd.reducescatter(
                to_scatter, op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5))
        return {"sum": tape.gradient(summed, x), "average": tape.gradient(averaged, x),
                "allgather": tape.gradient(gathered, rows), "broadcast": tape.gradient(broadcast, x),
                "alltoall": tape.gradient(exchanged, to_send), "reducescatter": tape.gradient(scattered, to_scatter),
                "reducescatter_scaled": tape.gradient(scaled, to_scatter)}

    start = r * (r + 1) // 2
    # What rank j received from this rank: rows starting after those of ranks s < r.
    sent_back = np.concatenate([exchanged_weights[j][sum(j + s + 1 for s in range(r)):][:j + r + 1] for j in range(n)])

    def check(results):
        np.testing.assert_array_equal(results["sum"], sum(weights))
        np.testing.assert_allclose(results["average"], sum(weights) / n, rtol=1e-15)
        np.testing.assert_allclose(results["allgather"], (sum(gathered_weights) / n)[start:start + r + 1], rtol=1e-15)
        np.testing.assert_allclose(results["broadcast"], sum(weights) / n if r == 0 else np.zeros((3, 2)), rtol=1e-15)
        np.testing.assert_array_equal(results["alltoall"], sent_back)
        np.testing.assert_array_equal(results["reducescatter"], n * np.concatenate(scattered_weights))
        np.testing.assert_array_equal(results["reducescatter_scaled"], 1.5 * np.concatenate(scattered_weights))

    _assert_in_both_modes(tf, compute, check)


def check_mismatched_shapes_fail_everywhere(tf, hvd):
    """Ranks that disagree about a tensor's shape all get an error naming it, eagerly and in a
    tf.function, and the job goes on."""
    r = hvd.rank()
    with pytest.raises(tf.errors.FailedPreconditionError, match="shape.*mismatched"):
        hvd.allreduce(tf.zeros([r + 1]), name="mismatched")
    with pytest.raises(tf.errors.UnknownError, match="mismatched_in_graph.*shape"):
        tf.function(lambda: hvd.allreduce(tf.zeros([r + 1]), name="mismatched_in_graph"))()
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == hvd.size()


def check_gradient_tape_equivalence(tf, hvd):
    """N ranks x batch b with DistributedGradientTape reach the weights of one process with
    batch N*b (float64, SGD with momentum, several steps), eagerly and in tf.function, with a
    sparse (IndexedSlices) gradient allgathered or made dense, and with groups and
    gradient_predivide_factor."""
    n, r = hvd.size(), hvd.rank()
    b, steps, lr, momentum = 4, 3, 0.1, 0.9
    rng = np.random.default_rng(7)
    features = rng.normal(size=(n * b * steps, 4))
    ids = rng.integers(0, 10, size=n * b * steps)
    targets = rng.normal(size=(n * b * steps, 1))
    initial = [rng.normal(size=shape) * 0.5 for shape in [(4, 8), (8,), (10, 8), (8, 1)]]

    def train(distributed, options, compile_step, rows_of_step):
        variables = [tf.Variable(w) for w in initial]
        velocities = [np.zeros_like(w) for w in initial]

        def gradients(x, i, y):
            with tf.GradientTape() as tape:
                w1, b1, embedding, w2 = variables
                hidden = tf.tanh(x @ w1 + b1 + tf.gather(embedding, i))
                loss = tf.reduce_mean((hidden @ w2 - y) ** 2)
            if distributed:
                tape = hvd.DistributedGradientTape(tape, **options)
            return tape.gradient(loss, variables)

        step_gradients = tf.function(gradients) if compile_step else gradients
        for step in range(steps):
            rows = rows_of_step(step)
            grads = step_gradients(tf.constant(features[rows]), tf.constant(ids[rows]), tf.constant(targets[rows]))
            assert isinstance(grads[2], tf.IndexedSlices) == (not distributed or not options.get("sparse_as_dense"))
            for variable, velocity, grad in zip(variables, velocities, grads):
                velocity *= momentum
                velocity += np.asarray(tf.convert_to_tensor(grad))
                variable.assign_sub(lr * velocity)
        return [v.numpy() for v in variables]

    reference = train(False, {}, False, lambda s: slice(s * n * b, (s + 1) * n * b))
    for options, compile_step in [({}, False), ({}, True),
                                  ({"sparse_as_dense": True, "groups": 2, "gradient_predivide_factor": 2.0}, True)]:
        got = train(True, options, compile_step, lambda s: slice(s * n * b + r * b, s * n * b + (r + 1) * b))
        for mine, want in zip(got, reference):
            np.testing.assert_allclose(mine, want, rtol=1e-12, atol=1e-14, err_msg=str(options))


def check_process_set(tf, hvd, ends):
    """Collectives, their gradients and DistributedGradientTape within the set of ranks 0 and 2;
    rank 1, outside it, is refused."""
    r = hvd.rank()
    assert int(hvd.process_set_included_op(1)) == (r != 1) and int(hvd.process_set_included_op()) == 1
    assert (int(hvd.cross_rank_op()), int(hvd.cross_size_op())) == (hvd.cross_rank(), hvd.cross_size())
    if not ends.included():
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"rank 1 is not a member of process set 1 \(ranks \[0, 2\]\)"):
            hvd.allreduce(tf.ones(2), process_set=ends)
        with pytest.raises(RuntimeError, match="hvd.broadcast_variables"):
            hvd.broadcast_global_variables(0)
        return
    assert hvd.broadcast_object_fn(root_rank=2, name="set.object", process_set=ends)(f"from {r}") == "from 2"
    position = ends.rank()

    def compute():
        return {"sum": hvd.allreduce(tf.constant(_values(r, "int32")), op=hvd.Sum, name="set.sum", process_set=ends),
                "root": hvd.broadcast(tf.constant([r]), 2, name="set.root", process_set=ends),
                "size": hvd.size_op(process_set_id=1)}

    def check(results):
        np.testing.assert_array_equal(results["sum"], _values(0, "int32") + _values(2, "int32"))
        assert results["root"].tolist() == [2] and int(results["size"]) == 2

    _assert_in_both_modes(tf, compute, check)
    x = tf.Variable(tf.fill([position + 1, 2], float(r)))
    with tf.GradientTape() as tape:
        gathered = hvd.allgather(x, name="set.gather", process_set=ends)
        loss = tf.reduce_sum(gathered * tf.reshape(tf.range(6.0), [3, 2]))
    assert gathered[:, 0].numpy().tolist() == [0.0, 2.0, 2.0]
    # Allgather's gradient: this rank's rows at its position in the set, not at its rank.
    np.testing.assert_array_equal(tape.gradient(loss, x), np.arange(6.0).reshape(3, 2)[position:2 * position + 1])
    w = tf.Variable([1.0, 1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(r + 1))
    tape = hvd.DistributedGradientTape(tape, process_set=ends)
    np.testing.assert_array_equal(tape.gradient(loss, [w])[0], [2.0, 2.0])  # the mean of 1 and 3


def test_tensorflow_api_on_three_ranks(mpirun):
    # Three ranks: an odd count catches ring and splitting bugs; the Keras tests and the
    # Horovod scripts run on two.
    mpirun(3, ranks_tensorflow_api, timeout=180, env=QUIET)
