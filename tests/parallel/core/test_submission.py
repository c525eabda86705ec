"""What a submission is checked for (hvdtrain/core/submission.py), on a running engine: arguments
that can never work are refused on the spot, before any rank waits; a read-only input is fine
when the result goes elsewhere; a tensor outside its bucket, or a bucket of another dtype, is
refused; and arrays submitted again under the same names, as training does every step (the
engine then skips validating them again), still have whatever changed seen: values, op, shape,
bucket, writeability. The checks of device buffers without a GPU are in
tests/single/core/test_submission.py."""

import math

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import ReduceOp


def arguments_that_can_never_work_are_refused_when_submitted():
    core.init()
    n = core.size()
    ones = np.ones(4)
    read_only = np.ones(4)
    read_only.flags.writeable = False
    refused = [
        (ValueError, "root_rank .* is not a rank", lambda: core.broadcast_async(ones, root_rank=n, name="r")),
        (ValueError, "root_rank -1 is not a rank", lambda: core.broadcast_async(ones, root_rank=-1, name="r")),
        (ValueError, "splits must be", lambda: core.alltoall_async(ones, splits=[4] + [0] * n, name="s")),
        (ValueError, "splits must be", lambda: core.alltoall_async(ones, splits=[6, -2] + [0] * (n - 2), name="s")),
        (ValueError, "splits must be", lambda: core.alltoall_async(ones, splits=[0] * (n - 1) + [3], name="s")),
        (ValueError, r"splits must be integers \(row counts\), got \[1.5, 2.5",
         lambda: core.alltoall_async(ones, splits=[1.5, 2.5] + [0] * (n - 2), name="s")),
        (ValueError, "must be contiguous", lambda: core.allreduce_async(np.ones(8)[::2], name="c")),
        (ValueError, "must be contiguous", lambda: core.allgather_async(np.ones((3, 2), order="F"), name="c")),
        (TypeError, "cannot reduce dtype bool", lambda: core.allreduce_async(np.ones(3, bool), name="b")),
        (TypeError, "cannot reduce dtype bool", lambda: core.reducescatter_async(np.ones(3, bool), name="b")),
        (TypeError, "expected a NumPy array or a CUDA array \\(CuPy\\), got list",
         lambda: core.allreduce_async([1.0, 2.0], name="l")),
        (TypeError, "holds Python object references",
         lambda: core.allgather_async(np.array([None, 1], dtype=object), name="o")),
        (ValueError, "output must be a contiguous array of shape \\(4,\\)",
         lambda: core.allreduce_async(ones, name="o", output=np.ones(5))),
        (TypeError, "output must be a NumPy array like the tensor, got list",
         lambda: core.allreduce_async(ones, name="o", output=[0.0] * 4)),
        (ValueError, "must be finite", lambda: core.allreduce_async(ones, name="f", prescale_factor=float("nan"))),
        (NotImplementedError, "Adasum", lambda: core.allreduce_async(ones, name="a", op=ReduceOp.ADASUM)),
        (RuntimeError, "Adasum", lambda: core.reducescatter_async(ones, name="rs", op=ReduceOp.ADASUM)),
        (ValueError, "non-empty string", lambda: core.allreduce_async(ones, name="")),
        (ValueError, "at least one dimension", lambda: core.allgather_async(np.array(1.0), name="d")),
        (ValueError, "result goes into is read-only", lambda: core.allreduce_async(read_only, name="ro")),
        (ValueError, "result goes into is read-only",
         lambda: core.broadcast_async(ones, 0, name="ro", output=read_only)),
    ]
    for error, message, submit in refused:
        with pytest.raises(error, match=message):
            submit()
    core.shutdown()


def a_read_only_input_is_reduced_into_an_output():
    core.init()
    read_only = np.ones(4)
    read_only.flags.writeable = False
    summed = core.allreduce_async(read_only, name="ro", output=np.empty(4), op=ReduceOp.SUM).wait()
    assert summed.tolist() == [core.size()] * 4
    core.shutdown()


def a_tensor_outside_its_bucket_or_of_another_dtype_is_refused():
    core.init()
    flat = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="does not lie inside bucket 'b'"):
        core.allreduce_async(np.zeros(3, np.float32), name="outside", bucket=("b", flat))
    with pytest.raises(ValueError, match="reduced in place"):
        core.allreduce_async(flat[:3], name="out_of_place", output=np.zeros(3, np.float32), bucket=("b", flat))
    with pytest.raises(ValueError, match="bucket 'b' holds float64, not float32"):
        core.allreduce_async(flat[:3], name="wrong_dtype", bucket=("b", np.zeros(10, np.float64)))
    core.shutdown()


# ----------------------------------------------------------------------------- resubmission

BUCKET_SHAPES = ((5,), (70000,), (3,), (40, 50), (1,), (300,))
BUCKET_GAPS = (0, 2, 0, 1, 0, 3)  # elements left out after each tensor
BUCKET_SIZE = sum(math.prod(shape) for shape in BUCKET_SHAPES) + sum(BUCKET_GAPS)


def rank_input(rank, step):
    """Quarters of small integers: their sums over the ranks are exact in float32."""
    return (np.random.default_rng((rank, step)).integers(-10**6, 10**6 + 1, BUCKET_SIZE) / 4).astype(np.float32)


def arrays_submitted_again_get_exact_results_and_have_their_changes_seen():
    core.init()
    n, me = core.size(), core.rank()
    flat = np.zeros(BUCKET_SIZE, np.float32)
    regions, start = [], 0
    for shape, gap in zip(BUCKET_SHAPES, BUCKET_GAPS):
        regions.append((start, start + math.prod(shape)))
        start += math.prod(shape) + gap
    views = [flat[start:stop].reshape(shape) for (start, stop), shape in zip(regions, BUCKET_SHAPES)]

    def step(label, op, shapes=BUCKET_SHAPES):
        inputs = [rank_input(rank, label) for rank in range(n)]
        flat[:] = inputs[me]
        handles = [core.allreduce_async(view, name=f"resubmitted.{i}", op=op, bucket=("grads", flat))
                   for i, view in enumerate(views)]
        assert all(h.wait() is view for h, view in zip(handles, views))
        for view, shape in zip(views, shapes):
            assert view.shape == shape
        every = np.stack(inputs).astype(np.float64)
        reduced = every.sum(axis=0) if op == ReduceOp.SUM else every.max(axis=0)
        expected = inputs[me].astype(np.float64)  # the gaps keep this rank's own values
        for start, stop in regions:
            expected[start:stop] = reduced[start:stop]
        wrong = np.flatnonzero(flat.astype(np.float64) != expected)
        assert wrong.size == 0, f"step {label}: {wrong.size} elements wrong, first at {wrong[:1]}"

    for label in range(3):
        step(label, ReduceOp.SUM)
    step(10, ReduceOp.MAX)
    views[3].shape = (50, 40)  # the same array object, reshaped in place
    step(11, ReduceOp.SUM, BUCKET_SHAPES[:3] + ((50, 40),) + BUCKET_SHAPES[4:])
    if n > 1:
        if me == 1:
            views[3].shape = (40, 50)
        with pytest.raises(core.TensorMismatchError) as raised:
            core.allreduce_async(views[3], name="resubmitted.3", op=ReduceOp.SUM, bucket=("grads", flat)).wait()
        assert raised.value.field == "shape", raised.value

    other = np.zeros(BUCKET_SIZE, np.float32)
    with pytest.raises(ValueError, match="does not lie inside bucket 'grads'"):
        core.allreduce_async(views[0], name="resubmitted.0", op=ReduceOp.SUM, bucket=("grads", other))
    views[1].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        core.allreduce_async(views[1], name="resubmitted.1", op=ReduceOp.SUM, bucket=("grads", flat))
    core.shutdown()


# ----------------------------------------------------------------------------- the jobs

REFUSED = [arguments_that_can_never_work_are_refused_when_submitted, a_read_only_input_is_reduced_into_an_output]
JOBS = {"alone": [a_tensor_outside_its_bucket_or_of_another_dtype_is_refused,
                  arrays_submitted_again_get_exact_results_and_have_their_changes_seen],
        2: [arrays_submitted_again_get_exact_results_and_have_their_changes_seen],
        3: REFUSED + [arrays_submitted_again_get_exact_results_and_have_their_changes_seen]}


def job(ranks, num_proc):
    return ranks.alone(JOBS["alone"]) if num_proc == "alone" else ranks.run(num_proc, JOBS[num_proc])


@pytest.mark.parametrize("check", REFUSED, ids=lambda check: check.__name__)
def test_submissions_are_checked_on_three_ranks(ranks, check):
    job(ranks, 3).assert_passed(check)


def test_a_tensor_outside_its_bucket_or_of_another_dtype_is_refused(ranks):
    job(ranks, "alone").assert_passed(a_tensor_outside_its_bucket_or_of_another_dtype_is_refused)


@pytest.mark.parametrize("num_proc", ["alone", 2, 3])
def test_arrays_submitted_again_get_exact_results_and_have_their_changes_seen(ranks, num_proc):
    job(ranks, num_proc).assert_passed(arrays_submitted_again_get_exact_results_and_have_their_changes_seen)
