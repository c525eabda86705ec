"""hvdtrain.tensorflow, the drop-in for horovod.tensorflow, on real ranks: its collectives
(hvdtrain/tensorflow/collectives.py) give exact results on tf.Tensors of several dtypes, eagerly
and inside tf.function, with Horovod's gradients; IndexedSlices, objects and join; within a
process set of two of three ranks; independent collectives in one tf.function, and in the backward
function of a tf.function differentiated outside it, finish (TensorFlow may start independent ops
in any order; ours run in the order they were built); in a TF1 graph run by a session on a single
thread, every collective gives its eager result, collectives that ranks start in opposite orders
finish (session_graphs.py), and gradients taken of each output of a grouped collective run
together; a graph holding collectives is freed once dropped; ranks that disagree get Horovod's TensorFlow errors, after
which the job goes on. A TF1 DistributedOptimizer (session_training.py) trains a graph like the
whole batch, also over two backward passes a step. DistributedGradientTape
(gradients.py) reaches the weights of one process with the whole batch, eagerly and in
tf.function, with a sparse gradient allgathered or made dense, with groups and
gradient_predivide_factor, and within a process set; a source registered as local keeps each
rank's own gradient. Three ranks catch ring and splitting bugs that two hide; the graph, error and
local-source checks run on two as well.

Scripts written for horovod.tensorflow and horovod.tensorflow.keras run unchanged on two ranks
except for their import line (tensorflow/scripts/), Horovod's TF1 MonitoredTrainingSession example
among them. Like most existing Horovod scripts they use Keras 2 idioms, so they run under tf-keras
(TF_USE_LEGACY_KERAS=1). Importing hvdtrain.tensorflow
imports TensorFlow, not torch, with hvdtrain.keras the same module as hvdtrain.tensorflow.keras,
and it works as a plain `python` process (a job of size 1). The Keras API is in
tests/parallel/tensorflow/test_keras.py.

TensorFlow takes seconds to import, so each job of ranks runs all the checks of its size. Every
check runs its collectives eagerly and traced by tf.function where both apply."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdtrain.launch import mpirun as launcher

GATHERED_DTYPES = ["float32", "int64", "bool", "float16"]
EXACT_DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"]
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "1"}  # TensorFlow's INFO lines would bury a failure's output
FLOAT_TOLERANCE = {"float32": 1e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}


# ----------------------------------------------------------------------------- the drop-in promise

SCRIPTS = Path(__file__).parent / "tensorflow" / "scripts"
IMPORT_LINES = {"horovod_tf1_digits.py": "import hvdtrain.tensorflow as hvd",
                "horovod_tf2_digits.py": "import hvdtrain.tensorflow as hvd",
                "horovod_keras_digits.py": "import hvdtrain.tensorflow.keras as hvd"}


@pytest.mark.parametrize("script", sorted(IMPORT_LINES))
def test_only_the_import_line_differs_from_horovod(script):
    lines = (SCRIPTS / script).read_text().splitlines()
    assert IMPORT_LINES[script] in lines
    docstring_end = lines.index('"""', 1)
    assert [line for line in lines[docstring_end:] if "hvdtrain" in line] == [IMPORT_LINES[script]]


@pytest.mark.parametrize("script", sorted(IMPORT_LINES))
def test_horovod_script_trains_on_two_ranks(script, tmp_path):
    base = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}
    env = launcher.worker_environment(2, {**os.environ, **base})
    command = launcher.mpirun_command([sys.executable, "-u", str(SCRIPTS / script), str(tmp_path)], num_proc=2,
                                      env=env)
    result = launcher.run(command, env=env, timeout=240, capture=True)
    assert result.returncode == 0, result.stdout
    accuracy = re.findall(r"Accuracy: ([\d.]+)%", result.stdout)
    assert len(accuracy) == 1 and float(accuracy[0]) > 90.0, result.stdout
    assert "weights identical on all ranks: True" in result.stdout, result.stdout
    if script == "horovod_keras_digits.py":
        assert "Epoch 3: finished gradual learning rate warmup to 0.002." in result.stdout, result.stdout
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint-{e}.h5" for e in range(1, 5)]
    if script == "horovod_tf1_digits.py":  # rank 0's MonitoredTrainingSession saved the last step
        assert (tmp_path / "model.ckpt-300.index").exists(), sorted(p.name for p in tmp_path.iterdir())


ALONE = """
import hvdtrain.tensorflow as hvd, hvdtrain.keras, hvdtrain.tensorflow.keras as tf_keras_api
from hvdtrain.tensorflow.keras.callbacks import MetricAverageCallback
import tensorflow as tf
assert tf_keras_api is hvdtrain.keras and MetricAverageCallback is hvdtrain.keras.callbacks.MetricAverageCallback
hvd.init()
assert (hvd.size(), hvd.rank()) == (1, 0)
assert float(hvd.allreduce(tf.constant(2.0), op=hvd.Sum)) == 2.0
assert hvd.allgather_object("only") == ["only"]
import sys
print(sorted({name.split('.')[0] for name in sys.modules}))
"""


def test_importing_it_imports_tensorflow_not_torch_and_it_works_alone():
    result = subprocess.run([sys.executable, "-c", ALONE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    modules = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert "tensorflow" in modules and "torch" not in modules


# The thread that signals a TF1 session's collectives finished must be done before the interpreter
# finalizes: a session it held the last reference to is deleted on it, in TensorFlow's C++ without
# the GIL, and Python ends a daemon thread that wants the GIL back after that (pthread_exit), which
# TensorFlow's C++ turns into an abort of the finished process. The probe is registered before
# hvdtrain.tensorflow's import and hvd.init(), so that it runs after their exit handlers.
SESSION_EXIT = """
import atexit, threading
signalling = lambda: [t for t in threading.enumerate() if t.name == "hvdtrain-session-collectives" and t.is_alive()]
atexit.register(lambda: print("signalling thread alive at exit:", bool(signalling())))
import tensorflow as tf
import hvdtrain.tensorflow as hvd
hvd.init()
with tf.Graph().as_default():
    total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
    with tf.compat.v1.Session() as session:
        assert session.run(total).tolist() == [1.0, 2.0]
"""


def test_the_thread_of_a_sessions_collectives_ends_before_the_interpreter_finalizes():
    result = subprocess.run([sys.executable, "-c", SESSION_EXIT], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **QUIET})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "signalling thread alive at exit: False", result.stdout


# A graph that holds collectives and their gradients is freed once its program drops it, as one
# without them is: a TF1 program or an Estimator may build many, and each tf.function trace is one.
# Each script builds one, checks the gradient it gives and prints whether it outlived collections
# for up to 2 s (the thread that signals a session's collectives lets go of the last one only
# after the session has been told it finished).
FREED_GRAPH = """
import gc, time, weakref
import tensorflow as tf
import hvdtrain.tensorflow as hvd
hvd.init()

def built():
    x = tf.constant([1.0, 2.0])
{build}
    return weakref.ref(graph)

graph = built()
for _ in range(100):
    gc.collect()
    if graph() is None:
        break
    time.sleep(0.02)
print("graph alive after collection:", graph() is not None)
"""
GRAPH_BUILDS = {
    "session graph": """
    with tf.Graph().as_default() as graph:
        x = tf.constant([1.0, 2.0])
        (gradient,) = tf.gradients(hvd.allreduce(x * 3.0, op=hvd.Sum), [x])
        with tf.compat.v1.Session() as session:
            assert session.run(gradient).tolist() == [3.0, 3.0]""",
    "tf.function": """
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            total = hvd.allreduce(x * 3.0, op=hvd.Sum)
        return tape.gradient(total, x)
    assert step(x).numpy().tolist() == [3.0, 3.0]
    graph = step.get_concrete_function(x).graph""",
}


@pytest.mark.parametrize("build", sorted(GRAPH_BUILDS))
def test_a_graph_with_collectives_is_freed_once_dropped(build):
    script = FREED_GRAPH.format(build=GRAPH_BUILDS[build])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **QUIET})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "graph alive after collection: False", result.stdout


# ----------------------------------------------------------------------------- collectives


def _started(process_sets=None):
    """TensorFlow and hvdtrain.tensorflow, initialized (with `process_sets`)."""
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd

    hvd.init(process_sets=process_sets)
    return tf, hvd


def _values(rank, dtype, shape=(2, 3)):
    """Small integers, so that sums and products are exact in every dtype."""
    import ml_dtypes

    numpy_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return (np.arange(int(np.prod(shape))).reshape(shape) % 4 + rank + 1).astype(numpy_dtype)


def _assert_in_both_modes(tf, compute, check):
    """`check(results)` for `compute()` run eagerly and traced by tf.function."""
    check({key: np.asarray(value) for key, value in compute().items()})
    check({key: np.asarray(value) for key, value in tf.function(compute)().items()})


# ----------------------------------------------------------------------------- reductions


def allreduce_is_exact_for_every_dtype_and_op():
    tf, hvd = _started()
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
        return results

    def check(results):
        for key, result in results.items():
            dtype, op_name = key.split("/")
            assert result.dtype.name == dtype, (key, result.dtype)
            want = expected[op_name](every[dtype], axis=0)
            if op_name == "average":
                np.testing.assert_allclose(result.astype(np.float64), want, rtol=FLOAT_TOLERANCE[dtype])
            else:
                np.testing.assert_array_equal(result.astype(np.float64), want, err_msg=str(key))

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


def allreduce_applies_the_scale_factors():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()

    def compute():
        x = tf.constant(_values(r, "float64"))
        return {"scaled": hvd.allreduce(x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.25)}

    def check(results):
        np.testing.assert_array_equal(results["scaled"], 0.75 * sum(_values(k, "float64") for k in range(n)))

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


def fp16_compression_keeps_the_dtype_and_exact_values():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()

    def compute():
        return {"fp16": hvd.allreduce(tf.constant(_values(r, "float32")), op=hvd.Sum,
                                      compression=hvd.Compression.fp16)}

    def check(results):
        assert results["fp16"].dtype == np.float32
        np.testing.assert_array_equal(results["fp16"], sum(_values(k, "float32") for k in range(n)))

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


def grouped_allreduce_reduces_members_of_different_dtypes_and_shapes():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()

    def compute():
        a, b = hvd.grouped_allreduce([tf.constant(_values(r, "float32")), tf.constant(_values(r, "int64", (5,)))],
                                     op=hvd.Sum)
        return {"grouped_a": a, "grouped_b": b}

    def check(results):
        np.testing.assert_array_equal(results["grouped_a"], sum(_values(k, "float32") for k in range(n)))
        np.testing.assert_array_equal(results["grouped_b"], sum(_values(k, "int64", (5,)) for k in range(n)))

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


# ----------------------------------------------------------------------------- data movement


def _rows(rank, dtype):
    return (np.arange((rank + 1) * 2).reshape(rank + 1, 2) + 10 * rank).astype(dtype)


def allgather_concatenates_a_ragged_first_dimension_single_and_grouped():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()

    def compute():
        results = {f"gather_{d}": hvd.allgather(tf.constant(_rows(r, d))) for d in GATHERED_DTYPES}
        results["gather_a"], results["gather_b"] = hvd.grouped_allgather(
            [tf.constant(_rows(r, "float64")), tf.constant(_rows(r, "int32")[:, :1])])
        return results

    def check(results):
        for dtype in GATHERED_DTYPES:
            want = np.concatenate([_rows(k, dtype) for k in range(n)])
            np.testing.assert_array_equal(results[f"gather_{dtype}"], want)
            assert results[f"gather_{dtype}"].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(results["gather_a"], np.concatenate([_rows(k, "float64") for k in range(n)]))
        np.testing.assert_array_equal(results["gather_b"],
                                      np.concatenate([_rows(k, "int32")[:, :1] for k in range(n)]))

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


def broadcast_gives_every_rank_the_roots_values():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    root = n - 1

    def compute():
        return {f"broadcast_{dtype}": hvd.broadcast(tf.constant(_values(r, "int32").astype(dtype)), root)
                for dtype in ("float64", "int32", "bool")}

    def check(results):
        for dtype in ("float64", "int32", "bool"):
            np.testing.assert_array_equal(results[f"broadcast_{dtype}"], _values(root, "int32").astype(dtype))

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


def alltoall_sends_each_rank_its_rows_with_splits_and_without():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    splits = [j + r + 1 for j in range(n)]
    to_send = np.concatenate([np.full((s, 2), 100 * r + j, np.int32) for j, s in enumerate(splits)])

    def compute():
        results = {}
        results["alltoall"], results["received_splits"] = hvd.alltoall(tf.constant(to_send), splits=splits)
        results["alltoall_even"] = hvd.alltoall(tf.constant(np.full((2 * n, 1), r, np.int64)))
        return results

    def check(results):
        np.testing.assert_array_equal(results["received_splits"], [r + s + 1 for s in range(n)])
        np.testing.assert_array_equal(
            results["alltoall"], np.concatenate([np.full((r + s + 1, 2), 100 * s + r, np.int32) for s in range(n)]))
        np.testing.assert_array_equal(results["alltoall_even"], np.repeat(np.arange(n), 2).reshape(2 * n, 1))

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


def reducescatter_gives_the_first_rank_the_extra_row_summed_or_averaged():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    scatter_input = np.arange((2 * n + 1) * 3, dtype=np.float64).reshape(2 * n + 1, 3) * (r + 1)

    def compute():
        return {"scatter_sum": hvd.reducescatter(tf.constant(scatter_input), op=hvd.Sum),
                "scatter_average": hvd.reducescatter(tf.constant(scatter_input), op=hvd.Average)}

    total = sum(np.arange((2 * n + 1) * 3, dtype=np.float64).reshape(2 * n + 1, 3) * (k + 1) for k in range(n))
    mine = slice(sum(2 + (k < 1) for k in range(r)), sum(2 + (k < 1) for k in range(r + 1)))

    def check(results):
        np.testing.assert_array_equal(results["scatter_sum"], total[mine])
        np.testing.assert_allclose(results["scatter_average"], total[mine] / n, rtol=1e-15)

    _assert_in_both_modes(tf, compute, check)
    hvd.shutdown()


# ----------------------------------------------------------------------------- slices, objects, join


def allreduce_of_indexed_slices_averages_them_as_slices():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()

    def slices(rank):
        values, indices = np.full((rank + 1, 3), rank + 1.0), np.arange(rank + 1) + rank
        return tf.IndexedSlices(tf.constant(values), tf.constant(indices), dense_shape=tf.constant([2 * n, 3]))

    reduced = hvd.allreduce(slices(r), op=hvd.Average)
    assert isinstance(reduced, tf.IndexedSlices)
    want = sum(np.asarray(tf.convert_to_tensor(slices(k))) for k in range(n)) / n
    np.testing.assert_allclose(np.asarray(tf.convert_to_tensor(reduced)), want, rtol=1e-15)
    hvd.shutdown()


def object_collectives_carry_python_objects():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    assert hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1) == {"from": n - 1, "list": [n - 1] * 3}
    assert hvd.allgather_object("x" * r) == ["x" * k for k in range(n)]
    hvd.shutdown()


def join_returns_the_same_last_rank_everywhere():
    tf, hvd = _started()
    n = hvd.size()
    last = int(hvd.join())
    assert 0 <= last < n and hvd.allgather_object(last) == [last] * n
    hvd.shutdown()


# ----------------------------------------------------------------------------- gradients


def _gradients_in_both_modes(tf, inputs, loss_of, check):
    """`check` the gradients of `loss_of(*inputs())` with respect to `inputs()`, eagerly and traced."""
    def compute():
        watched = inputs()
        with tf.GradientTape() as tape:
            tape.watch(watched)
            loss = loss_of(*watched)
        return dict(enumerate(tape.gradient(loss, watched)))

    _assert_in_both_modes(tf, compute, check)


def allreduces_gradient_reduces_the_incoming_gradients_with_the_same_op():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    weights = [np.arange(6.0).reshape(3, 2) + k for k in range(n)]  # rank k's upstream gradient
    def x():
        return [tf.constant(np.arange(6.0).reshape(3, 2) * (r + 1))]

    def check_sum(gradients):
        np.testing.assert_array_equal(gradients[0], sum(weights))

    def check_average(gradients):
        np.testing.assert_allclose(gradients[0], sum(weights) / n, rtol=1e-15)

    _gradients_in_both_modes(tf, x, lambda x: tf.reduce_sum(weights[r] * hvd.allreduce(x, op=hvd.Sum)), check_sum)
    _gradients_in_both_modes(tf, x, lambda x: tf.reduce_sum(weights[r] * hvd.allreduce(x, op=hvd.Average)),
                             check_average)
    hvd.shutdown()


def allgathers_gradient_averages_the_incoming_gradients_and_keeps_this_ranks_rows():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    gathered_weights = [np.arange((n * (n + 1) // 2) * 2.0).reshape(-1, 2) * (k + 1) for k in range(n)]
    start = r * (r + 1) // 2

    def check(gradients):
        np.testing.assert_allclose(gradients[0], (sum(gathered_weights) / n)[start:start + r + 1], rtol=1e-15)

    _gradients_in_both_modes(tf, lambda: [tf.constant(np.ones((r + 1, 2)))],
                             lambda rows: tf.reduce_sum(gathered_weights[r] * hvd.allgather(rows)), check)
    hvd.shutdown()


def broadcasts_gradient_is_the_average_on_the_root_and_zero_elsewhere():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    weights = [np.arange(6.0).reshape(3, 2) + k for k in range(n)]

    def check(gradients):
        np.testing.assert_allclose(gradients[0], sum(weights) / n if r == 0 else np.zeros((3, 2)), rtol=1e-15)

    _gradients_in_both_modes(tf, lambda: [tf.constant(np.arange(6.0).reshape(3, 2) * (r + 1))],
                             lambda x: tf.reduce_sum(weights[r] * hvd.broadcast(x, 0)), check)
    hvd.shutdown()


def alltoalls_gradient_is_sent_back_where_the_rows_came_from():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    received_rows = [sum(k + s + 1 for s in range(n)) for k in range(n)]  # rank k gets k+s+1 rows from rank s
    exchanged_weights = [np.arange(rows * 2.0).reshape(-1, 2) + 0.5 * k for k, rows in enumerate(received_rows)]
    # What rank j received from this rank: rows starting after those of ranks s < r.
    sent_back = np.concatenate([exchanged_weights[j][sum(j + s + 1 for s in range(r)):][:j + r + 1] for j in range(n)])

    def exchanged(to_send):
        received, _ = hvd.alltoall(to_send, splits=[j + r + 1 for j in range(n)])
        return tf.reduce_sum(exchanged_weights[r] * received)

    def check(gradients):
        np.testing.assert_array_equal(gradients[0], sent_back)

    _gradients_in_both_modes(tf, lambda: [tf.constant(np.ones((sum(j + r + 1 for j in range(n)), 2)))], exchanged,
                             check)
    hvd.shutdown()


def reducescatters_gradient_allgathers_the_incoming_ones_times_its_factors_and_the_size_for_sum():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    scattered_weights = [np.full((3 if k == 0 else 2, 3), k + 1.0) for k in range(n)]  # 2n+1 rows, split

    def to_scatter():
        return [tf.constant(np.ones((2 * n + 1, 3)))]

    def check_sum(gradients):
        np.testing.assert_array_equal(gradients[0], n * np.concatenate(scattered_weights))

    def check_scaled(gradients):
        np.testing.assert_array_equal(gradients[0], 1.5 * np.concatenate(scattered_weights))

    _gradients_in_both_modes(tf, to_scatter, lambda x: tf.reduce_sum(
        scattered_weights[r] * hvd.reducescatter(x, op=hvd.Sum)), check_sum)
    _gradients_in_both_modes(tf, to_scatter, lambda x: tf.reduce_sum(scattered_weights[r] * hvd.reducescatter(
        x, op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5)), check_scaled)
    hvd.shutdown()


# ----------------------------------------------------------------------------- process sets


def collectives_in_a_process_set_involve_its_members_and_refuse_the_others():
    """The set of ranks 0 and 2; rank 1, outside it, is refused; allgather's gradient is this
    rank's rows at its position in the set, not at its rank."""
    import hvdtrain.tensorflow as hvd

    ends = hvd.ProcessSet([0, 2])
    tf, hvd = _started(process_sets=[ends])
    r = hvd.rank()
    assert int(hvd.process_set_included_op(1)) == (r != 1) and int(hvd.process_set_included_op()) == 1
    assert (int(hvd.cross_rank_op()), int(hvd.cross_size_op())) == (hvd.cross_rank(), hvd.cross_size())
    if not ends.included():
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"rank 1 is not a member of process set 1 \(ranks \[0, 2\]\)"):
            hvd.allreduce(tf.ones(2), process_set=ends)
        with pytest.raises(RuntimeError, match="hvd.broadcast_variables"):
            hvd.broadcast_global_variables(0)
        hvd.shutdown()
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
    np.testing.assert_array_equal(tape.gradient(loss, x), np.arange(6.0).reshape(3, 2)[position:2 * position + 1])
    hvd.shutdown()


# ----------------------------------------------------------------------------- graphs


def _one_thread_session(tf):
    """A TF1 session that runs a step's ops on a single thread: a collective that held it while
    waiting for peers would hang ranks that started different ones first."""
    return tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                                                intra_op_parallelism_threads=1))


def collectives_in_a_session_graph_give_the_eager_results_on_one_thread():
    """Every collective built into a TF1 graph and fetched in one run of a single-thread session."""
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    with tf.Graph().as_default():
        x = tf.constant(_values(r, "float32"))
        variable = tf.compat.v1.get_variable("w", initializer=tf.fill([2], float(r)))
        fetches = {
            "sum": hvd.allreduce(x, op=hvd.Sum),
            "compressed": hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16),
            "grouped": hvd.grouped_allreduce([x, tf.cast(x, tf.int64)], op=hvd.Sum),
            "gathered": hvd.allgather(tf.fill([r + 1, 2], float(r))),
            "broadcast": hvd.broadcast(x, root_rank=n - 1),
            "alltoall": hvd.alltoall(tf.range(r * n, (r + 1) * n), splits=[1] * n),
            "scattered": hvd.reducescatter(tf.fill([n + 1], float(r + 1)), op=hvd.Sum),
            "barrier": hvd.barrier(),
        }
        assign_root = hvd.broadcast_global_variables(0)
        last_joined = hvd.join()
        with _one_thread_session(tf) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got = session.run(fetches)
            session.run(assign_root)
            assert session.run(variable).tolist() == [0.0, 0.0]
            assert session.run(last_joined) in range(n)
            assert hvd.broadcast_object({"from": r}, root_rank=1, session=session) == {"from": 1}
    total = sum(_values(k, "float32") for k in range(n))
    np.testing.assert_array_equal(got["sum"], total)
    assert got["compressed"].dtype == np.float32 and np.array_equal(got["compressed"], total)
    np.testing.assert_array_equal(got["grouped"][1], total.astype(np.int64))
    assert got["gathered"][:, 0].tolist() == [float(k) for k in range(n) for _ in range(k + 1)]
    np.testing.assert_array_equal(got["broadcast"], _values(n - 1, "float32"))
    assert got["alltoall"][0].tolist() == [k * n + r for k in range(n)] and got["alltoall"][1].tolist() == [1] * n
    rows = 2 if r == 0 else 1
    np.testing.assert_array_equal(got["scattered"], np.full(rows, n * (n + 1) / 2))
    assert got["barrier"] is None
    hvd.shutdown()


def the_gradients_of_each_output_of_grouped_collectives_run_together_in_a_session():
    """tf.gradients taken of each output of a grouped allgather, allreduce and reducescatter on
    its own (a collective in each gradient) and fetched in one run: Horovod's per-rank gradients."""
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    with tf.Graph().as_default():
        ragged = [tf.fill([r + 1, 2], float(i + 1)) for i in range(3)]
        even = [tf.fill([2 * n, 2], float(i + 1)) for i in range(3)]
        gathered = hvd.grouped_allgather(ragged)
        reduced = hvd.grouped_allreduce(even, op=hvd.Sum)
        scattered = hvd.grouped_reducescatter(even, op=hvd.Sum)
        fetches = {name: [tf.gradients(output, tensor)[0] for output, tensor in zip(outputs, tensors)]
                   for name, outputs, tensors in (("gathered", gathered, ragged), ("reduced", reduced, even),
                                                  ("scattered", scattered, even))}
        with _one_thread_session(tf) as session:
            got = session.run(fetches)
    for gradient in got["gathered"]:  # the ones of every rank averaged, this rank's rows
        np.testing.assert_array_equal(gradient, np.ones((r + 1, 2)))
    for gradient in got["reduced"]:  # the ones of every rank summed
        np.testing.assert_array_equal(gradient, np.full((2 * n, 2), n))
    for gradient in got["scattered"]:  # every rank's ones gathered, times the size for Sum
        np.testing.assert_array_equal(gradient, np.full((2 * n, 2), n))
    hvd.shutdown()


def independent_collectives_started_in_opposite_orders_finish_on_one_thread():
    """The even ranks build (and a single thread starts) the collectives in one order, the odd
    ranks in the reverse; the same run fetches them all, and again a subset."""
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    with tf.Graph().as_default():
        order = range(6) if r % 2 == 0 else reversed(range(6))
        reduced = {k: hvd.allreduce(tf.constant([float(k + r)]), op=hvd.Sum, name=f"order.{k}") for k in order}
        with _one_thread_session(tf) as session:
            for keys in ([0, 1, 2, 3, 4, 5], [4, 1]):
                got = session.run({k: reduced[k] for k in keys})
                assert {k: v.tolist() for k, v in got.items()} == {k: [k * n + n * (n - 1) / 2] for k in keys}
    hvd.shutdown()


def mismatched_shapes_in_a_session_fail_on_every_rank_and_the_session_goes_on():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    with tf.Graph().as_default():
        mismatched = hvd.allreduce(tf.zeros([r + 1]), name="mismatched_in_session")
        fine = hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="fine_in_session")
        with _one_thread_session(tf) as session:
            with pytest.raises(tf.errors.FailedPreconditionError, match="Mismatched.*mismatched_in_session.*shape"):
                session.run(mismatched)
            assert session.run(fine) == n
    with tf.Graph().as_default():
        mismatched = hvd.allreduce(tf.zeros([r + 1]), name="mismatched_in_monitored_session")
        with pytest.raises(tf.errors.FailedPreconditionError, match="mismatched_in_monitored_session.*shape"):
            with tf.compat.v1.train.MonitoredTrainingSession(config=tf.compat.v1.ConfigProto(
                    inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)) as session:
                session.run(mismatched)
    hvd.shutdown()


def independent_collectives_in_a_tf_function_and_its_backward_function_finish():
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
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
    hvd.shutdown()


# ----------------------------------------------------------------------------- errors


def mismatched_shapes_fail_on_every_rank_eagerly_and_in_tf_function():
    """Ranks that disagree about a tensor's shape all get an error naming it, and the job goes on."""
    tf, hvd = _started()
    r = hvd.rank()
    with pytest.raises(tf.errors.FailedPreconditionError, match="shape.*mismatched"):
        hvd.allreduce(tf.zeros([r + 1]), name="mismatched")
    with pytest.raises(tf.errors.UnknownError, match="mismatched_in_graph.*shape"):
        tf.function(lambda: hvd.allreduce(tf.zeros([r + 1]), name="mismatched_in_graph"))()
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == hvd.size()
    hvd.shutdown()


def ranks_that_disagree_get_horovods_tensorflow_errors():
    """tf.errors.FailedPreconditionError (eagerly; see hvdtrain.tensorflow.collectives), bad
    alltoall splits InvalidArgumentError, eagerly and in tf.function, as Horovod's ops raise
    them; then the job goes on."""
    tf, hvd = _started()
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
    hvd.shutdown()


# ----------------------------------------------------------------------------- DistributedGradientTape


def _tape_trains_like_the_whole_batch(options, compile_step):
    """DistributedGradientTape(`options`), its gradients computed eagerly or in a tf.function
    (`compile_step`), against one process with the whole batch."""
    tf, hvd = _started()
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
    got = train(True, options, compile_step, lambda s: slice(s * n * b + r * b, s * n * b + (r + 1) * b))
    for mine, want in zip(got, reference):
        np.testing.assert_allclose(mine, want, rtol=1e-12, atol=1e-14, err_msg=str(options))
    hvd.shutdown()


def the_tape_trains_like_the_whole_batch_eagerly():
    _tape_trains_like_the_whole_batch({}, compile_step=False)


def the_tape_trains_like_the_whole_batch_in_tf_function():
    _tape_trains_like_the_whole_batch({}, compile_step=True)


def the_tape_with_dense_sparse_gradients_groups_and_predivision_trains_like_the_whole_batch():
    _tape_trains_like_the_whole_batch({"sparse_as_dense": True, "groups": 2, "gradient_predivide_factor": 2.0},
                                      compile_step=True)


def the_tape_in_a_process_set_averages_over_its_members():
    """The set of ranks 0 and 2: the mean of their gradients 1 and 3; rank 1, outside it, keeps
    its own gradient 2, as in Horovod."""
    import hvdtrain.tensorflow as hvd

    ends = hvd.ProcessSet([0, 2])
    tf, hvd = _started(process_sets=[ends])
    r = hvd.rank()
    w = tf.Variable([1.0, 1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(r + 1))
    tape = hvd.DistributedGradientTape(tape, process_set=ends)
    expected = 2.0 if ends.included() else float(r + 1)
    np.testing.assert_array_equal(tape.gradient(loss, [w])[0], [expected, expected])
    hvd.shutdown()


def _tf1_optimizer_trains_like_the_whole_batch(options, momentum, passes=1):
    """A TF1 graph trained by minimize() of hvd.DistributedOptimizer(MomentumOptimizer(...),
    `options`) in a single-thread session, each update from `passes` passes of b rows per rank,
    against one process with the whole batch; returns the distributed optimizer. (With
    momentum, a sparse update leaves the velocity of rows without gradient as it is, a dense
    one decays it: the reference's sparse gradients match only sparse ones.)"""
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    b, updates, lr = 4, 3, 0.1
    rows_of_update = n * b * passes
    rng = np.random.default_rng(7)
    features = rng.normal(size=(rows_of_update * updates, 4))
    ids = rng.integers(0, 10, size=rows_of_update * updates)
    targets = rng.normal(size=(rows_of_update * updates, 1))
    initial = [rng.normal(size=shape) * 0.5 for shape in [(4, 8), (8,), (10, 8), (8, 1)]]

    def train(optimizer_of, batches):
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float64, [None, 4])
            i = tf.compat.v1.placeholder(tf.int64, [None])
            y = tf.compat.v1.placeholder(tf.float64, [None, 1])
            w1, b1, embedding, w2 = [tf.compat.v1.get_variable(f"v{k}", initializer=w) for k, w in enumerate(initial)]
            loss = tf.reduce_mean((tf.tanh(x @ w1 + b1 + tf.gather(embedding, i)) @ w2 - y) ** 2)
            optimizer = optimizer_of(tf.compat.v1.train.MomentumOptimizer(lr, momentum))
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train_op = optimizer.minimize(loss, global_step=global_step)
            with _one_thread_session(tf) as session:
                session.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                for rows in batches:
                    session.run(train_op, {x: features[rows], i: ids[rows], y: targets[rows]})
                return session.run([w1, b1, embedding, w2]), session.run(global_step), optimizer

    reference, reference_steps, _ = train(lambda opt: opt, [slice(u * rows_of_update, (u + 1) * rows_of_update)
                                                           for u in range(updates)])
    mine = [u * rows_of_update + (p * n + r) * b for u in range(updates) for p in range(passes)]
    got, steps, distributed = train(lambda opt: hvd.DistributedOptimizer(opt, **options),
                                    [slice(first, first + b) for first in mine])
    for mine, want in zip(got, reference):
        np.testing.assert_allclose(mine, want, rtol=1e-12, atol=1e-14, err_msg=str(options))
    assert (reference_steps, steps) == (updates, updates * passes)  # every pass counts the global step
    hvd.shutdown()
    return distributed


def a_tf1_optimizer_trains_like_the_whole_batch_in_a_session():
    """The embedding's sparse gradient allgathered as slices, the others averaged in one group."""
    _tf1_optimizer_trains_like_the_whole_batch({}, momentum=0.9)


def a_tf1_optimizer_with_dense_sparse_gradients_and_two_passes_per_step_trains_like_the_whole_batch():
    distributed = _tf1_optimizer_trains_like_the_whole_batch(
        {"sparse_as_dense": True, "backward_passes_per_step": 2, "average_aggregated_gradients": True}, momentum=0.0,
        passes=2)
    assert distributed._agg_helper.counter.name.endswith("aggregation_counter:0")  # which Horovod's users read


def _local_source_keeps_its_own_gradient(scale):
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    shared, own = tf.Variable([1.0, 1.0]), tf.Variable([1.0, 1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((shared + own) * (r + 1))
    tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
    tape.register_local_source(own)
    shared_gradient, own_gradient = tape.gradient(loss, [shared, own])
    np.testing.assert_allclose(shared_gradient, np.full(2, (n + 1) / 2))
    np.testing.assert_allclose(own_gradient, np.full(2, (r + 1) / n if scale else r + 1.0))
    hvd.shutdown()


def a_local_source_keeps_its_own_gradient_divided_by_the_size():
    _local_source_keeps_its_own_gradient(scale=True)


def a_local_source_keeps_its_own_gradient_whole_with_scale_local_gradients_false():
    _local_source_keeps_its_own_gradient(scale=False)


# ----------------------------------------------------------------------------- the jobs

ON_THREE_RANKS = [allreduce_is_exact_for_every_dtype_and_op, allreduce_applies_the_scale_factors,
                  fp16_compression_keeps_the_dtype_and_exact_values,
                  grouped_allreduce_reduces_members_of_different_dtypes_and_shapes,
                  allgather_concatenates_a_ragged_first_dimension_single_and_grouped,
                  broadcast_gives_every_rank_the_roots_values, alltoall_sends_each_rank_its_rows_with_splits_and_without,
                  reducescatter_gives_the_first_rank_the_extra_row_summed_or_averaged,
                  allreduce_of_indexed_slices_averages_them_as_slices, object_collectives_carry_python_objects,
                  join_returns_the_same_last_rank_everywhere,
                  allreduces_gradient_reduces_the_incoming_gradients_with_the_same_op,
                  allgathers_gradient_averages_the_incoming_gradients_and_keeps_this_ranks_rows,
                  broadcasts_gradient_is_the_average_on_the_root_and_zero_elsewhere,
                  alltoalls_gradient_is_sent_back_where_the_rows_came_from,
                  reducescatters_gradient_allgathers_the_incoming_ones_times_its_factors_and_the_size_for_sum,
                  collectives_in_a_process_set_involve_its_members_and_refuse_the_others,
                  mismatched_shapes_fail_on_every_rank_eagerly_and_in_tf_function]
ON_TWO_AND_THREE_RANKS = [collectives_in_a_session_graph_give_the_eager_results_on_one_thread,
                          the_gradients_of_each_output_of_grouped_collectives_run_together_in_a_session,
                          independent_collectives_started_in_opposite_orders_finish_on_one_thread,
                          mismatched_shapes_in_a_session_fail_on_every_rank_and_the_session_goes_on,
                          independent_collectives_in_a_tf_function_and_its_backward_function_finish,
                          ranks_that_disagree_get_horovods_tensorflow_errors]
TAPE_ON_THREE_RANKS = [the_tape_trains_like_the_whole_batch_eagerly, the_tape_trains_like_the_whole_batch_in_tf_function,
                       the_tape_with_dense_sparse_gradients_groups_and_predivision_trains_like_the_whole_batch,
                       the_tape_in_a_process_set_averages_over_its_members,
                       a_tf1_optimizer_trains_like_the_whole_batch_in_a_session,
                       a_tf1_optimizer_with_dense_sparse_gradients_and_two_passes_per_step_trains_like_the_whole_batch]
LOCAL_SOURCES = [a_local_source_keeps_its_own_gradient_divided_by_the_size,
                 a_local_source_keeps_its_own_gradient_whole_with_scale_local_gradients_false]


def job(ranks, num_proc):
    checks = ON_TWO_AND_THREE_RANKS + LOCAL_SOURCES + (ON_THREE_RANKS + TAPE_ON_THREE_RANKS if num_proc == 3 else [])
    return ranks.run(num_proc, checks, env=QUIET, timeout=300)


@pytest.mark.parametrize("check", ON_THREE_RANKS, ids=lambda check: check.__name__)
def test_collectives_on_three_ranks(ranks, check):
    job(ranks, 3).assert_passed(check)


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("check", ON_TWO_AND_THREE_RANKS, ids=lambda check: check.__name__)
def test_graphs_and_errors(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("check", TAPE_ON_THREE_RANKS, ids=lambda check: check.__name__)
def test_the_tape_on_three_ranks(ranks, check):
    job(ranks, 3).assert_passed(check)


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("check", LOCAL_SOURCES, ids=lambda check: check.__name__)
def test_local_sources_keep_each_ranks_own_gradient(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)
