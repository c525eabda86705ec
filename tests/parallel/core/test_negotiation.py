"""Negotiation on real ranks (hvdtrain/core/negotiation.py): ranks that submit in different orders,
from two threads and at different times still get exact results, through the coordinator and
through the response cache (hits, invalidation when a shape changes, eviction when the cache is
small or off); ranks that disagree about a tensor all get an error naming the field and each
rank's value, within seconds; a collective refused on one rank fails on the others naming its
reason; a stall is reported with the missing ranks, and after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
the waiting ranks fail instead of hanging. The cache and the coordinator on their own are in
tests/single/core/test_negotiation.py."""

import io
import os
import random
import sys
import threading
import time

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import HorovodInternalError, ReduceOp, TensorMismatchError
from hvdtrain.core.requests import Kind

NAMES = 200
STEPS = 5
SHAPE_CHANGE_STEP = 3  # from this step on, some tensors have another shape
SECONDS_TO_FAIL = 10  # generous: the CPU is shared; a hang is minutes


# ----------------------------------------------------------------------------- out of order


def tensor(i, step, rank, n):
    """Tensor i of a step on `rank`: (kind, array, options, expected result)."""
    changed = step >= SHAPE_CHANGE_STEP

    def data(r, shape, dtype):
        return ((np.arange(int(np.prod(shape))) + 3 * r + i + 5 * step) % 50).reshape(shape).astype(dtype)

    if i % 10 == 3:  # allgather, with rows that differ per rank (and change on rank 1 only)
        def rows(r):
            return 1 + r % 3 + (changed and r == 1)
        return (Kind.ALLGATHER, data(rank, (rows(rank), 2), np.int64), {},
                np.concatenate([data(r, (rows(r), 2), np.int64) for r in range(n)]))
    if i % 10 == 7:
        root = i % n
        return Kind.BROADCAST, data(rank, (4,), np.float32), {"root_rank": root}, data(root, (4,), np.float32)
    shape = (i % 5 + 1 + (changed and i % 20 == 0), 3)
    dtype, op = ((np.int32, ReduceOp.SUM), (np.float64, ReduceOp.MAX), (np.float32, ReduceOp.SUM))[i % 3]
    inputs = np.stack([data(r, shape, dtype) for r in range(n)])
    expected = (inputs.sum(0) if op == ReduceOp.SUM else inputs.max(0)).astype(dtype)
    return Kind.ALLREDUCE, data(rank, shape, dtype), {"op": op}, expected


SUBMIT = {Kind.ALLREDUCE: core.allreduce_async, Kind.ALLGATHER: core.allgather_async,
          Kind.BROADCAST: core.broadcast_async}


def run_steps(n, me):
    for step in range(STEPS):
        rng = random.Random(f"{me}.{step}")
        order = rng.sample(range(NAMES), NAMES)
        tensors = {i: tensor(i, step, me, n) for i in order}
        handles = {}

        def submit(indices):
            for i in indices:
                kind, array, options, _ = tensors[i]
                handles[i] = SUBMIT[kind](array, name=f"t{i}", **options)
                if rng.random() < 0.1:
                    time.sleep(rng.uniform(0, 0.003))

        if step == 1:  # from two threads at once
            helper = threading.Thread(target=submit, args=(order[1::2],))
            helper.start()
            submit(order[::2])
            helper.join()
        else:
            submit(order)
        for i in order:
            got = handles[i].wait()
            expected = tensors[i][3]
            assert got.dtype == expected.dtype and np.array_equal(got, expected), \
                f"step {step}, tensor t{i} on rank {me}: {got} != {expected}"


def steps_with_cache_capacity(capacity, cached_names):
    """The steps on an engine started with HOROVOD_CACHE_CAPACITY=`capacity` (None: unset, the
    default), whose cache then holds `cached_names` names: its size shows which path the steps
    took. The variable is restored afterwards."""
    before = os.environ.pop("HOROVOD_CACHE_CAPACITY", None)
    if capacity is not None:
        os.environ["HOROVOD_CACHE_CAPACITY"] = capacity
    try:
        core.init()
        run_steps(core.size(), core.rank())
        assert len(core.running_engine()._cache) == cached_names, (capacity, len(core.running_engine()._cache))
        core.shutdown()
    finally:
        os.environ.pop("HOROVOD_CACHE_CAPACITY", None)
        if before is not None:
            os.environ["HOROVOD_CACHE_CAPACITY"] = before


def out_of_order_submissions_are_exact_through_the_response_cache():
    steps_with_cache_capacity(None, NAMES)


def out_of_order_submissions_are_exact_with_the_cache_off():
    steps_with_cache_capacity("0", 0)


def out_of_order_submissions_are_exact_with_a_cache_too_small_for_the_names():
    steps_with_cache_capacity("7", 7)


OUT_OF_ORDER = [out_of_order_submissions_are_exact_through_the_response_cache,
                out_of_order_submissions_are_exact_with_the_cache_off,
                out_of_order_submissions_are_exact_with_a_cache_too_small_for_the_names]


# ----------------------------------------------------------------------------- disagreements


def timed_failure(expected_error, submit):
    """Wait on what `submit()` returns, expecting `expected_error`; return it and the seconds taken."""
    started = time.perf_counter()
    with pytest.raises(expected_error) as raised:
        submit().wait()
    return raised.value, time.perf_counter() - started


def mismatch_cases(odd):
    """(tensor name, field, what this rank submits); rank 1 is the `odd` one out."""
    ones = np.ones(3)
    return [
        ("m.shape", "shape", lambda: core.allreduce_async(np.ones(3 + odd), name="m.shape")),
        ("m.dtype", "dtype",
         lambda: core.allreduce_async(ones.astype(np.float32 if odd else np.float64), name="m.dtype")),
        ("m.op", "op", lambda: core.allreduce_async(ones, name="m.op", op=ReduceOp.MAX if odd else ReduceOp.SUM)),
        ("m.prescale", "prescale_factor",
         lambda: core.allreduce_async(ones, name="m.prescale", prescale_factor=0.5 if odd else 1.0)),
        ("m.postscale", "postscale_factor",
         lambda: core.allreduce_async(ones, name="m.postscale", postscale_factor=2.0 if odd else 1.0)),
        ("m.root", "root_rank", lambda: core.broadcast_async(ones, root_rank=int(odd), name="m.root")),
        ("m.kind", "operation",
         lambda: (core.allgather_async if odd else core.allreduce_async)(ones, name="m.kind")),
        ("m.rows", "shape (all but the first dimension)",
         lambda: core.allgather_async(np.ones((2, 3 + odd)), name="m.rows")),
        ("m.scatter", "shape", lambda: core.reducescatter_async(np.ones(4 + odd), name="m.scatter")),
        # A tensor that ran before (so it is in the response cache) and now differs on rank 1.
        ("m.cached", "shape", lambda: core.allreduce_async(np.ones(3 + odd), name="m.cached")),
    ]


def mismatched_tensors_fail_on_every_rank_naming_the_field_and_each_ranks_value():
    core.init()
    n, me = core.size(), core.rank()
    for _ in range(2):
        core.allreduce_async(np.ones(3), name="m.cached").wait()
    for name, field, submit in mismatch_cases(odd=me == 1):
        error, seconds = timed_failure(TensorMismatchError, submit)
        assert seconds < SECONDS_TO_FAIL, f"{name}: the error took {seconds:.1f} s"
        assert (error.tensor_name, error.field) == (name, field), error
        assert set(error.values_by_rank) == set(range(n)), error.values_by_rank
        others = [r for r in range(n) if r != 1]
        assert f"'{name}'" in str(error) and f"Mismatched {field}" in str(error), error
        assert f"rank 1: {error.values_by_rank[1]}" in str(error), error
        assert f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}: " in str(error), error
        # The engine goes on working.
        assert core.allreduce_async(np.ones(2), name="after.mismatch", op=ReduceOp.SUM).wait().tolist() == [n, n]
    core.shutdown()


def a_collective_refused_on_one_rank_fails_on_the_others_naming_its_reason():
    """A collective refused on rank 1 alone (splits differ by rank) fails on the ranks that
    submitted it, naming rank 1's reason, instead of leaving them waiting; unnamed ones keep
    every rank's numbering in step, and the next collectives run."""
    core.init()
    n, me = core.size(), core.rank()
    rows = np.arange(n, dtype=np.float64) + 10 * me
    splits = [1.0] * n if me == 1 else [1] * n
    for name in ("a2a.refused", None):
        if me == 1:
            with pytest.raises(ValueError, match=rf"splits must be integers \(row counts\), got \[{', '.join(['1.0'] * n)}\]"):
                core.alltoall_async(rows, splits=splits, name=name)
        else:
            error, seconds = timed_failure(HorovodInternalError,
                                           lambda: core.alltoall_async(rows, splits=splits, name=name))
            assert "was refused when submitted (rank 1: " in str(error) and "splits must be integers" in str(error), error
            assert seconds < SECONDS_TO_FAIL, seconds
        received, _ = core.alltoall_async(rows).wait()
        assert received.tolist() == [10 * r + me for r in range(n)]
    core.shutdown()


def a_group_with_one_tensor_refused_on_one_rank_fails_whole_everywhere():
    core.init()
    n, me = core.size(), core.rank()
    arrays = [np.ones(2), np.ones(2, bool) if me == 1 else np.ones(2)]
    if me == 1:
        with pytest.raises(TypeError, match="cannot reduce dtype bool"):
            core.grouped_allreduce_async(arrays, name="group.refused")
    else:
        for handle in core.grouped_allreduce_async(arrays, name="group.refused"):
            with pytest.raises(HorovodInternalError, match="rank 1: .*cannot reduce dtype bool"):
                handle.wait()
    assert core.allreduce_async(np.ones(2), name="group.refused_0", op=ReduceOp.SUM).wait().tolist() == [n, n]
    core.shutdown()


ON_THREE_RANKS = [mismatched_tensors_fail_on_every_rank_naming_the_field_and_each_ranks_value,
                  a_collective_refused_on_one_rank_fails_on_the_others_naming_its_reason,
                  a_group_with_one_tensor_refused_on_one_rank_fails_whole_everywhere]


def job(ranks, num_proc):
    return ranks.run(num_proc, OUT_OF_ORDER + (ON_THREE_RANKS if num_proc == 3 else []), timeout=240)


@pytest.mark.parametrize("num_proc", [2, 3, 4])
@pytest.mark.parametrize("check", OUT_OF_ORDER, ids=lambda check: check.__name__)
def test_out_of_order_and_late_submissions_are_exact(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("check", ON_THREE_RANKS, ids=lambda check: check.__name__)
def test_ranks_that_disagree_fail_together(ranks, check):
    job(ranks, 3).assert_passed(check)


# ----------------------------------------------------------------------------- stalls


def a_stall_is_reported_on_rank_0_naming_the_late_rank_only():
    """HOROVOD_STALL_CHECK_TIME_SECONDS=1: a tensor that some ranks submit and another submits
    seconds later is reported on rank 0, with the missing rank, then completes."""
    captured = io.StringIO()
    sys.stderr = captured  # the engine's log handler, made at the first init, writes here
    core.init()
    sys.stderr = sys.__stderr__
    n, me = core.size(), core.rank()
    for _ in range(2):
        core.allreduce_async(np.ones(2), name="stall.cached", op=ReduceOp.SUM).wait()
    # Seconds each rank waits before submitting: rank 1 is a little late with the cached tensor
    # (well within the stall time), which must not get it called missing.
    for name, delays in (("stall.new", {1: 3.5}), ("stall.cached", {1: 0.3, 2: 3.5})):
        time.sleep(delays.get(me, 0))
        got = core.allreduce_async(np.ones(2), name=name, op=ReduceOp.SUM).wait()
        assert got.tolist() == [n, n], (name, got)
    core.barrier()
    core.shutdown()
    log = captured.getvalue()
    if me == 0:
        assert "rank 1 has not submitted ['stall.new']" in log, log
        assert "rank 2 has not submitted ['stall.cached']" in log, log
        assert "HOROVOD_STALL_CHECK_TIME_SECONDS=1" in log, log
        # Only the late rank is named.
        assert "rank 2 has not submitted ['stall.new']" not in log, log
        assert "rank 1 has not submitted ['stall.cached']" not in log, log
    else:
        assert "Stall" not in log, log


def test_a_stall_is_reported_on_rank_0_naming_the_late_rank_only(ranks):
    ranks.run(3, [a_stall_is_reported_on_rank_0_naming_the_late_rank_only],
              env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"}).assert_passed(
        a_stall_is_reported_on_rank_0_naming_the_late_rank_only)


def the_stall_shutdown_fails_the_waiting_ranks_and_stops_the_missing_ones_engine():
    """HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2: the waiting ranks fail instead of hanging, and the
    rank that never submitted finds its engine stopped."""
    core.init()
    # The stall is timed from the first rank's submission, which may come before this rank's
    # own: the clock starts before a barrier that no rank leaves before every rank entered it.
    started = time.perf_counter()
    core.barrier()
    if core.rank() != 1:
        error, _ = timed_failure(HorovodInternalError, lambda: core.allreduce_async(np.ones(1), name="stalled"))
        seconds = time.perf_counter() - started
        assert "rank 1 has not submitted ['stalled']" in str(error), error
        assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2" in str(error), error
        assert 2 <= seconds < 2 + SECONDS_TO_FAIL, seconds
    else:
        deadline = time.monotonic() + 2 + SECONDS_TO_FAIL
        while core.is_initialized() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not core.is_initialized(), "the engine of the rank that never submitted still runs"
    with pytest.raises(HorovodInternalError, match="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"):
        core.allreduce_async(np.ones(1), name="after.stall")
    core.shutdown()


def test_the_stall_shutdown_fails_the_waiting_ranks_instead_of_hanging(ranks):
    ranks.run(3, [the_stall_shutdown_fails_the_waiting_ranks_and_stops_the_missing_ones_engine],
              env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"}).assert_passed(
        the_stall_shutdown_fails_the_waiting_ranks_and_stops_the_missing_ones_engine)
