"""Bad input and failures end in clear errors, within seconds, on every rank concerned; never
in a hang. Ranks that disagree about a tensor, bad arguments, stalls, a rank that shuts down,
bad environment values."""

import io
import logging
import sys
import time

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import HorovodInternalError, ReduceOp, TensorMismatchError
from hvdtrain.core.settings import MIB, Settings, from_environment

SECONDS_TO_FAIL = 10  # generous: the CPU is shared; a hang is minutes


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


def check_mismatches(n, me):
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


def check_refused_at_submission(n):
    """Arguments that can never work are refused on the spot, before any rank waits."""
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
        (TypeError, "expected a NumPy array or a CUDA array \\(CuPy\\), got list", lambda: core.allreduce_async([1.0, 2.0], name="l")),
        (TypeError, "holds Python object references",
         lambda: core.allgather_async(np.array([None, 1], dtype=object), name="o")),
        (ValueError, "output must be a contiguous array of shape \\(4,\\)",
         lambda: core.allreduce_async(ones, name="o", output=np.ones(5))),
        (TypeError, "output must be a NumPy array like the tensor, got list",
         lambda: core.allreduce_async(ones, name="o", output=[0.0] * 4)),
        (ValueError, "must be finite", lambda: core.allreduce_async(ones, name="f", prescale_factor=float("nan"))),
        (NotImplementedError, "Adasum", lambda: core.allreduce_async(ones, name="a", op=ReduceOp.ADASUM)),
        (ValueError, "non-empty string", lambda: core.allreduce_async(ones, name="")),
        (ValueError, "at least one dimension", lambda: core.allgather_async(np.array(1.0), name="d")),
        (ValueError, "result goes into is read-only", lambda: core.allreduce_async(read_only, name="ro")),
        (ValueError, "result goes into is read-only",
         lambda: core.broadcast_async(ones, 0, name="ro", output=read_only)),
    ]
    for error, message, submit in refused:
        with pytest.raises(error, match=message):
            submit()
    # A read-only input is fine when the result goes elsewhere.
    summed = core.allreduce_async(read_only, name="ro", output=np.empty(4), op=ReduceOp.SUM).wait()
    assert summed.tolist() == [n] * 4


def check_refusal_on_one_rank(n, me):
    """A collective refused on rank 1 alone (splits differ by rank) fails on the ranks that
    submitted it, naming rank 1's reason, instead of leaving them waiting; unnamed ones keep
    every rank's numbering in step, and the next collectives run."""
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
    # One tensor of a group refused on rank 1: the whole group fails everywhere.
    arrays = [np.ones(2), np.ones(2, bool) if me == 1 else np.ones(2)]
    if me == 1:
        with pytest.raises(TypeError, match="cannot reduce dtype bool"):
            core.grouped_allreduce_async(arrays, name="group.refused")
    else:
        for handle in core.grouped_allreduce_async(arrays, name="group.refused"):
            with pytest.raises(HorovodInternalError, match="rank 1: .*cannot reduce dtype bool"):
                handle.wait()
    assert core.allreduce_async(np.ones(2), name="group.refused_0", op=ReduceOp.SUM).wait().tolist() == [n, n]


def check_duplicate_names(n):
    first = core.allreduce_async(np.ones(2), name="dup", op=ReduceOp.SUM)
    with pytest.raises(ValueError, match="'dup' is already in flight"):
        core.allreduce_async(np.ones(2), name="dup")
    # A group is queued whole or not at all: group_0 is not left behind when group_1 clashes.
    clash = core.allreduce_async(np.ones(2), name="group_1", op=ReduceOp.SUM)
    with pytest.raises(ValueError, match="'group_1' is already in flight"):
        core.grouped_allreduce_async([np.ones(1), np.ones(1)], name="group")
    assert first.wait().tolist() == [n, n] and clash.wait().tolist() == [n, n]
    # Once finished, the names are free again.
    assert core.allreduce_async(np.ones(2), name="dup", op=ReduceOp.SUM).wait().tolist() == [n, n]
    assert [h.wait().tolist() for h in core.grouped_allreduce_async([np.ones(1), np.ones(1)], name="group",
                                                                    op=ReduceOp.SUM)] == [[n], [n]]


def check_shutdown_of_one_rank(me):
    """Rank 1 shuts down while the others wait for a tensor it will never submit."""
    if me == 1:
        time.sleep(0.5)
        core.shutdown()
        with pytest.raises(ValueError, match="not been initialized"):
            core.allreduce_async(np.ones(1), name="after.shutdown")
        return
    error, seconds = timed_failure(HorovodInternalError, lambda: core.allreduce_async(np.ones(1), name="orphan"))
    assert "shut down" in str(error) and seconds < SECONDS_TO_FAIL, (error, seconds)
    with pytest.raises(HorovodInternalError, match="shut down"):
        core.allreduce_async(np.ones(1), name="after.shutdown")


def ranks_errors():
    core.init()
    n, me = core.size(), core.rank()
    check_mismatches(n, me)
    check_refused_at_submission(n)
    check_refusal_on_one_rank(n, me)
    check_duplicate_names(n)
    check_shutdown_of_one_rank(me)


def test_errors(mpirun):
    mpirun(3, ranks_errors, timeout=120)


# ----------------------------------------------------------------------------- stalls


def ranks_stall_warnings():
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


def test_stall_is_reported_with_the_missing_ranks(mpirun):
    mpirun(3, ranks_stall_warnings, timeout=120, env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})


def ranks_stall_shutdown():
    """HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2: the waiting ranks fail instead of hanging, and the
    rank that never submitted finds its engine stopped."""
    core.init()
    me = core.rank()
    if me != 1:
        error, seconds = timed_failure(HorovodInternalError, lambda: core.allreduce_async(np.ones(1), name="stalled"))
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


def test_stall_shutdown_fails_the_waiting_ranks(mpirun):
    mpirun(3, ranks_stall_shutdown, timeout=120,
           env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})


# ----------------------------------------------------------------------------- environment


def test_settings_default_to_horovods():
    assert from_environment({}) == Settings()
    assert Settings().fusion_threshold_bytes == 128 * MIB and Settings().cycle_time_s == 0.001
    assert (Settings().cache_capacity, Settings().stall_check_time_s, Settings().stall_shutdown_time_s) == (1024, 60, 0)
    assert Settings().log_level == logging.WARNING


def test_settings_read_the_environment():
    settings = from_environment({
        "HOROVOD_FUSION_THRESHOLD": "65536", "HOROVOD_CYCLE_TIME": "3.5", "HOROVOD_CACHE_CAPACITY": "0",
        "HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1", "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "7",
        "HOROVOD_LOG_LEVEL": "DEBUG", "HVDTRAIN_CHUNK_BYTES": "1024",
    })
    assert settings == Settings(fusion_threshold_bytes=65536, cycle_time_s=0.0035, cache_capacity=0,
                                timeline_path="/tmp/t.json", timeline_mark_cycles=True, stall_check_enabled=False,
                                stall_check_time_s=5.0, stall_shutdown_time_s=7.0, log_level=logging.DEBUG,
                                chunk_bytes=1024)


BAD_VALUES = [
    ("HOROVOD_FUSION_THRESHOLD", "abc"), ("HOROVOD_FUSION_THRESHOLD", "1.5"), ("HOROVOD_FUSION_THRESHOLD", "-1"),
    ("HOROVOD_LOG_LEVEL", "loud"), ("HOROVOD_CYCLE_TIME", "fast"), ("HOROVOD_CACHE_CAPACITY", "-5"),
    ("HOROVOD_STALL_CHECK_TIME_SECONDS", "soon"), ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "-2"),
    ("HVDTRAIN_CHUNK_BYTES", "0"),
]


@pytest.mark.parametrize("variable, value", BAD_VALUES)
def test_bad_environment_value_names_the_variable(variable, value):
    with pytest.raises(ValueError, match=variable):
        from_environment({variable: value})


def test_init_refuses_a_bad_environment_value(monkeypatch):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "abc")
    with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD='abc'"):
        core.init()  # refused before MPI is touched
    assert not core.is_initialized()
