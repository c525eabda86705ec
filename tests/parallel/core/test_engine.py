"""The engine on real ranks (hvdtrain/core/engine.py, started and stopped by hvdtrain.core's
init() and shutdown()): allgather, broadcast, alltoall, barrier, join, the object collectives and
the topology give, on 2, 3 and 4 ranks and alone (a plain `python` process, a job of size 1),
what every rank's known inputs make; a caller blocked on a result ends the engine's wait for more
tensors; a name already in flight is refused; the ranks left waiting by a rank that shuts down
fail; init() starts MPI where the script told mpi4py not to; and errors of every kind, shutdowns
and restarts, with static and dynamic process sets, leave an engine that gives exact results."""

import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import HorovodInternalError, ProcessSet, ReduceOp, TensorMismatchError
from hvdtrain.core.requests import numpy_dtype

DTYPES = ("uint8", "int64", "float16", "bfloat16", "float64")
SECONDS_TO_FAIL = 10  # generous: the CPU is shared; a hang is minutes


def rank_data(rank, shape, dtype, salt=0):
    """Rank `rank`'s tensor: small integers, exact in every dtype, that differ by rank and position."""
    values = (np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int32) + 37 * rank + 11 * salt) % 100
    return values.reshape(shape).astype(numpy_dtype(dtype))


# ----------------------------------------------------------------------------- collectives


def topology_is_one_host_with_every_rank():
    core.init()
    n, me = core.size(), core.rank()
    topology = core.topology()
    assert (core.size(), core.rank()) == (n, me)
    assert (core.local_size(), core.local_rank()) == (n, me)
    assert (core.cross_size(), core.cross_rank()) == (1, 0)
    assert core.is_homogeneous()
    assert len(set(topology.hosts)) == 1 and len(topology.hosts) == n, topology.hosts
    assert core.allgather_object(topology, name="topology") == [
        topology.__class__(**{**vars(topology), "rank": r, "local_rank": r}) for r in range(n)]
    core.shutdown()


def allgather_concatenates_every_ranks_rows():
    core.init()
    n, me = core.size(), core.rank()
    rows = [(0, 3, 1, 2)[r % 4] for r in range(n)]  # rank 0 contributes no rows
    for d, dtype in enumerate(DTYPES):
        for trailing in ((), (2,), (2, 3)):
            got = core.allgather_async(rank_data(me, (rows[me],) + trailing, dtype, d),
                                       name=f"gather.{dtype}.{len(trailing)}").wait()
            expected = np.concatenate([rank_data(r, (rows[r],) + trailing, dtype, d) for r in range(n)])
            assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape)
            assert np.array_equal(got, expected), f"allgather {dtype} {trailing}: {got} != {expected}"
    core.shutdown()


def broadcast_gives_every_rank_the_roots_values_in_place_or_into_an_output():
    core.init()
    n, me = core.size(), core.rank()
    big = 5 * 1024 * 1024 + 3  # above the 1 MiB chunk: sent in pieces
    for root in range(n):
        for d, (dtype, shape) in enumerate((("float32", ()), ("bfloat16", (5,)), ("int64", (3, 4)),
                                            ("uint8", (big,)), ("float64", (2, 2, 2)))):
            name = f"bcast.{root}.{dtype}"
            expected, mine = rank_data(root, shape, dtype, d), rank_data(me, shape, dtype, d)
            in_place = mine.copy()
            assert core.broadcast_async(in_place, root, name=name + ".in_place").wait() is in_place
            assert np.array_equal(in_place, expected), f"{name} in place: {in_place} != {expected}"
            source, output = mine.copy(), np.zeros_like(mine)
            assert core.broadcast_async(source, root, name=name + ".output", output=output).wait() is output
            assert np.array_equal(output, expected), f"{name} into output: {output} != {expected}"
            assert np.array_equal(source, mine), f"{name}: the input changed"
    core.shutdown()


def alltoall_sends_each_rank_its_rows_with_uneven_or_even_splits():
    core.init()
    n, me = core.size(), core.rank()

    def splits_of(sender):  # uneven, with zeros
        return [(sender + 2 * receiver + 1) % 3 for receiver in range(n)]

    def rows(sender, receiver, count, dtype):  # each row says who sent it to whom
        codes = 16 * sender + 4 * receiver + np.arange(count)
        dtype = numpy_dtype(dtype)
        return np.stack([codes, codes if dtype.kind == "u" else -codes], axis=1).astype(dtype)

    for dtype in DTYPES:
        splits = splits_of(me)
        sent = np.concatenate([rows(me, r, splits[r], dtype) for r in range(n)])
        got, received_splits = core.alltoall_async(sent, splits=splits, name=f"alltoall.{dtype}").wait()
        expected = np.concatenate([rows(s, me, splits_of(s)[me], dtype) for s in range(n)])
        assert np.array_equal(got, expected) and got.dtype == expected.dtype, f"alltoall {dtype}: {got} != {expected}"
        assert received_splits.tolist() == [splits_of(s)[me] for s in range(n)], received_splits

    even = np.concatenate([rows(me, r, 2, "int64") for r in range(n)])
    got, received_splits = core.alltoall_async(even, name="alltoall.even").wait()
    assert np.array_equal(got, np.concatenate([rows(s, me, 2, "int64") for s in range(n)])), got
    assert received_splits.tolist() == [2] * n
    if n > 1:
        with pytest.raises(ValueError, match=f"divisible by the number of ranks \\({n}\\)"):
            core.alltoall_async(np.zeros(2 * n + 1), name="alltoall.uneven")
    core.shutdown()


def nobody_leaves_the_barrier_before_the_last_rank_arrives():
    core.init()
    me = core.rank()
    time.sleep(0.1 * me)
    arrived = time.time()
    core.barrier()
    left = time.time()
    arrivals = core.allgather_async(np.array([arrived]), name="barrier.arrivals").wait()
    assert left >= arrivals.max(), f"rank {me} left the barrier at {left}, before the last arrival {arrivals.max()}"
    core.shutdown()


def joined_ranks_contribute_zeros_and_join_returns_the_last_rank():
    """Ranks run out of data after different numbers of steps; the others go on reducing, with
    the joined ranks contributing zeros and AVERAGE still dividing by the size."""
    core.init()
    n, me = core.size(), core.rank()
    steps = [(6, 2, 8, 4)[r % 4] + r // 4 for r in range(n)]

    def data(rank, step):
        return np.arange(5, dtype=np.int64) * (rank + 1) - 4 * step + rank

    for step in range(steps[me]):
        active = [r for r in range(n) if steps[r] > step]
        total = sum(data(r, step) for r in active)
        summed = core.allreduce_async(data(me, step), name="join.sum", op=ReduceOp.SUM)
        averaged = core.allreduce_async(data(me, step), name="join.average")  # integers: truncated
        assert summed.wait().tolist() == total.tolist(), (step, active, summed.wait())
        assert averaged.wait().tolist() == np.trunc(total / n).tolist(), (step, active, averaged.wait())
    last = core.join()
    assert last == int(np.argmax(steps)), f"join returned {last} on rank {me}; steps were {steps}"

    # Afterwards every rank takes part again, and a second join starts from scratch.
    assert core.allreduce_async(np.ones(3), name="join.sum", op=ReduceOp.SUM).wait().tolist() == [n] * 3
    time.sleep(0.05 * ((me * 7) % n))
    last = core.join()
    assert set(core.allgather_object(last, name="join.last")) == {last}, "join returned different ranks"
    core.shutdown()


def object_collectives_carry_python_objects_named_or_in_call_order():
    core.init()
    n, me = core.size(), core.rank()
    for root in range(n):
        sent = {"root": root, "array": np.arange(root + 3), "text": "x" * 100 * root, "nested": [root, (root,)]}
        got = core.broadcast_object(sent if me == root else None, root_rank=root, name=f"object.{root}")
        assert got["root"] == root and got["text"] == sent["text"] and got["nested"] == sent["nested"], got
        assert np.array_equal(got["array"], sent["array"]), got
    # Unnamed calls match by their order, not by the type of what each rank passes.
    assert core.broadcast_object({"from": 0} if me == 0 else None) == {"from": 0}
    assert core.broadcast_object([n] if me == 0 else None) == [n]
    assert core.allgather_object(None if me % 2 else me) == [None if r % 2 else r for r in range(n)]
    gathered = core.allgather_object({"rank": me, "payload": list(range(10 * me))})
    assert gathered == [{"rank": r, "payload": list(range(10 * r))} for r in range(n)], gathered
    core.shutdown()


COLLECTIVES = [topology_is_one_host_with_every_rank, allgather_concatenates_every_ranks_rows,
               broadcast_gives_every_rank_the_roots_values_in_place_or_into_an_output,
               alltoall_sends_each_rank_its_rows_with_uneven_or_even_splits,
               nobody_leaves_the_barrier_before_the_last_rank_arrives,
               joined_ranks_contribute_zeros_and_join_returns_the_last_rank,
               object_collectives_carry_python_objects_named_or_in_call_order]


# ----------------------------------------------------------------------------- names and shutdowns


def a_name_already_in_flight_is_refused_until_its_collective_finishes():
    core.init()
    n = core.size()
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
    core.shutdown()


def ranks_waiting_for_a_rank_that_shut_down_fail_within_seconds():
    """Rank 1 shuts down while the others wait for a tensor it will never submit."""
    core.init()
    if core.rank() == 1:
        time.sleep(0.5)
        core.shutdown()
        with pytest.raises(ValueError, match="not been initialized"):
            core.allreduce_async(np.ones(1), name="after.shutdown")
        return
    started = time.perf_counter()
    with pytest.raises(HorovodInternalError) as raised:
        core.allreduce_async(np.ones(1), name="orphan").wait()
    seconds = time.perf_counter() - started
    assert "shut down" in str(raised.value) and seconds < SECONDS_TO_FAIL, (raised.value, seconds)
    with pytest.raises(HorovodInternalError, match="shut down"):
        core.allreduce_async(np.ones(1), name="after.shutdown")
    core.shutdown()


# ----------------------------------------------------------------------------- recovery and restarts


def _works_as_if_nothing_happened(n, label):
    """The next collectives run as if nothing had happened: unnamed ones included, which every
    rank must number alike."""
    me = core.rank()
    assert core.allreduce_async(np.ones(2), op=ReduceOp.SUM).wait().tolist() == [n, n], label
    gathered = core.grouped_allgather_async([np.full((me + 1,), me), np.full((1, 2), me)])
    assert gathered[0].wait().tolist() == [r for r in range(n) for _ in range(r + 1)], label
    assert gathered[1].wait().tolist() == [[r, r] for r in range(n)], label
    received, _ = core.alltoall_async(np.arange(n) + 10 * me).wait()
    assert received.tolist() == [10 * r + me for r in range(n)], label
    assert core.broadcast_async(np.full(3, me), n - 1, name=f"{label}.bcast").wait().tolist() == [n - 1] * 3, label


def _fail_in_many_ways(n, me):
    """Errors of every kind, each followed by collectives that must still work."""
    odd = me == 1
    read_only = np.ones(2)
    read_only.flags.writeable = False
    failures = [
        ("mismatched shape", TensorMismatchError,
         lambda: core.allreduce_async(np.ones(2 + odd), name="bad.shape").wait()),
        ("mismatched rows", TensorMismatchError,
         lambda: core.allgather_async(np.ones((2, 1 + odd)), name="bad.rows").wait()),
        ("mismatched kind", TensorMismatchError,
         lambda: (core.allgather_async if odd else core.allreduce_async)(np.ones(2), name="bad.kind").wait()),
        ("mismatched scatter", TensorMismatchError,
         lambda: core.reducescatter_async(np.ones(3 + odd), name="bad.scatter").wait()),
        ("mismatched root", TensorMismatchError,
         lambda: core.broadcast_async(np.ones(2), int(odd), name="bad.root").wait()),
        ("root outside", ValueError, lambda: core.broadcast_async(np.ones(2), n)),
        ("float splits", ValueError, lambda: core.alltoall_async(np.ones(n), splits=[1.0] * n)),
        ("read-only", ValueError, lambda: core.allreduce_async(read_only)),
        ("one of a group", ValueError, lambda: core.grouped_allreduce_async([np.ones(2), read_only])),
        ("bad dtype", TypeError, lambda: core.reducescatter_async(np.ones(3, bool))),
        ("adasum scatter", NotImplementedError, lambda: core.reducescatter_async(np.ones(2), op=ReduceOp.ADASUM)),
        ("no dynamic sets", ValueError, lambda: core.add_process_set([0, 1])),
    ]
    for label, error, fail in failures:
        with pytest.raises(error):
            fail()
        _works_as_if_nothing_happened(n, label)
    first = core.allreduce_async(np.ones(2), name="twice", op=ReduceOp.SUM)
    with pytest.raises(ValueError, match="already in flight"):
        core.allreduce_async(np.ones(2), name="twice")
    assert first.wait().tolist() == [n, n]
    _works_as_if_nothing_happened(n, "duplicate name")


def _in_static_sets(n, me):
    evens, odds = ProcessSet(range(0, n, 2)), ProcessSet(range(1, n, 2))
    core.init(process_sets=[evens, odds])
    assert (evens.process_set_id, odds.process_set_id) == (1, 2)
    mine = evens if me % 2 == 0 else odds
    summed = core.allreduce_async(np.full(2, me + 1.0), name="s", op=ReduceOp.SUM, process_set=mine).wait()
    assert summed.tolist() == [sum(r + 1.0 for r in mine.ranks)] * 2
    if len(mine.ranks) > 1:
        with pytest.raises(TensorMismatchError):
            core.allreduce_async(np.ones(1 + (me == mine.ranks[-1])), name="bad", process_set=mine).wait()
    assert core.allgather_object(me, process_set=mine) == mine.ranks
    assert core.allgather_async(np.full((1,), me), process_set=mine).wait().tolist() == mine.ranks
    _works_as_if_nothing_happened(n, "static sets")
    core.shutdown()
    assert evens.process_set_id is None and odds.process_set_id is None


def _in_dynamic_sets(n, me):
    core.init(process_sets="dynamic")
    ends = core.add_process_set([0, n - 1])
    assert ends.process_set_id == 1
    with pytest.raises(ValueError, match="different process sets"):
        core.add_process_set([min(me, 1)])  # ranks disagree: registration fails everywhere
    with pytest.raises(ValueError, match="already registered"):
        core.add_process_set([n - 1, 0])
    middle = core.add_process_set([1])
    assert middle.process_set_id == 2
    if ends.included():
        assert core.allreduce_async(np.full(2, me), name="e", op=ReduceOp.SUM, process_set=ends).wait().tolist() == \
            [n - 1.0] * 2
        assert core.allgather_async(np.full((1,), me), process_set=ends).wait().tolist() == [0, n - 1]
    if middle.included():
        assert core.allreduce_async(np.ones(1), name="e", process_set=middle).wait().tolist() == [1.0]
    if ends.included():
        with pytest.raises(TensorMismatchError):
            core.allreduce_async(np.ones(1 + (me == 0)), name="bad", process_set=ends).wait()
        assert core.allgather_object(me, process_set=ends) == [0, n - 1]
    assert core.remove_process_set(ends)
    again = core.add_process_set([0, n - 1])
    assert again.process_set_id == 3
    if again.included():
        assert core.allgather_object(me, process_set=again) == [0, n - 1]
    _works_as_if_nothing_happened(n, "dynamic sets")
    core.shutdown()


def errors_of_every_kind_leave_the_engine_working_before_and_after_a_restart():
    for _ in range(2):
        core.init()
        _fail_in_many_ways(core.size(), core.rank())
        core.shutdown()


def an_engine_started_again_works_and_a_stopped_one_refuses_collectives():
    core.init()
    core.shutdown()
    core.init()
    _works_as_if_nothing_happened(core.size(), "after re-init")
    core.shutdown()
    with pytest.raises(ValueError, match="not been initialized"):
        core.allreduce_async(np.ones(1))


def process_sets_are_numbered_from_1_by_every_engine_started():
    """Static sets, dynamic ones (sets 1 to 3 registered), then static ones again: their ids
    start at 1 again."""
    from mpi4py import MPI

    n, me = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    _in_static_sets(n, me)
    _in_dynamic_sets(n, me)
    _in_static_sets(n, me)


def ranks_left_by_a_peers_shutdown_start_again_without_a_shutdown_of_their_own():
    """Rank 1 shuts down while the others wait for it; they find their engine stopped, and all
    start again, its process sets released."""
    pair = ProcessSet([0, 1])
    core.init(process_sets=[pair])
    n, me = core.size(), core.rank()
    if me == 1:
        core.shutdown()
    else:
        with pytest.raises(HorovodInternalError, match="shut down"):
            core.allreduce_async(np.ones(1), name="orphan").wait()
    core.init()
    assert pair.process_set_id is None, "the sets of the stopped engine were not released"
    _works_as_if_nothing_happened(n, "after a peer's shutdown")
    core.shutdown()


def an_engine_started_again_numbers_its_unnamed_collectives_from_1():
    """As every rank does, so that their names agree: the timeline of the restarted engine shows
    the first unnamed allreduce and allgather."""
    core.init()
    n, me = core.size(), core.rank()
    _works_as_if_nothing_happened(n, "before the restart")
    folder = core.broadcast_object(tempfile.mkdtemp() if me == 0 else None, name="timeline folder")
    core.shutdown()
    core.init()
    core.start_timeline(f"{folder}/after.json")
    _works_as_if_nothing_happened(n, "final")
    core.stop_timeline()
    core.shutdown()
    if me == 0:
        rows = {e["args"]["name"] for e in json.loads(Path(f"{folder}/after.json").read_text())
                if e["name"] == "process_name"}
        assert "allreduce.noname.1" in rows and "allgather.noname.1_0" in rows, sorted(rows)


ON_THREE_RANKS = [a_name_already_in_flight_is_refused_until_its_collective_finishes,
                  ranks_waiting_for_a_rank_that_shut_down_fail_within_seconds,
                  errors_of_every_kind_leave_the_engine_working_before_and_after_a_restart,
                  an_engine_started_again_works_and_a_stopped_one_refuses_collectives,
                  process_sets_are_numbered_from_1_by_every_engine_started,
                  ranks_left_by_a_peers_shutdown_start_again_without_a_shutdown_of_their_own,
                  an_engine_started_again_numbers_its_unnamed_collectives_from_1]


def job(ranks, num_proc):
    """The job of `num_proc` ranks ("alone": one plain process) that runs this module's checks."""
    if num_proc == "alone":
        return ranks.alone(COLLECTIVES)
    return ranks.run(num_proc, COLLECTIVES + (ON_THREE_RANKS if num_proc == 3 else []), timeout=300)


@pytest.mark.parametrize("num_proc", ["alone", 2, 3, 4])
@pytest.mark.parametrize("check", COLLECTIVES, ids=lambda check: check.__name__)
def test_collectives_give_what_every_ranks_inputs_make(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("check", ON_THREE_RANKS, ids=lambda check: check.__name__)
def test_names_shutdowns_and_restarts_on_three_ranks(ranks, check):
    job(ranks, 3).assert_passed(check)


# ----------------------------------------------------------------------------- jobs of their own


def a_blocked_caller_ends_the_engines_wait_for_more_tensors():
    """HOROVOD_CYCLE_TIME=500: the engine waits half a second for more tensors to fuse, unless a
    caller blocks on a result, which ends that wait. Both waits are timed: a collective
    submitted and left alone is not hurried."""
    core.init()
    core.allreduce_async(np.ones(4), name="warm-up").wait()
    started = time.perf_counter()
    result = core.allreduce_async(np.ones(4), name="waited for").wait()
    waited = time.perf_counter() - started
    assert np.array_equal(result, np.ones(4))
    started = time.perf_counter()
    handle = core.allreduce_async(np.ones(4), name="left alone")
    while not handle.poll():
        time.sleep(0.005)
    left_alone = time.perf_counter() - started
    core.shutdown()
    assert waited < 0.2 <= 0.4 < left_alone, (waited, left_alone)


def test_a_blocked_caller_ends_the_engines_wait_for_more_tensors(ranks):
    ranks.alone([a_blocked_caller_ends_the_engines_wait_for_more_tensors], env={"HOROVOD_CYCLE_TIME": "500"}) \
        .assert_passed(a_blocked_caller_ends_the_engines_wait_for_more_tensors)


def init_starts_mpi_where_mpi4py_was_told_not_to():
    """The first thing its process does: nothing may have started MPI before."""
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    assert not MPI.Is_initialized()
    core.init()
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE
    n = core.size()
    assert core.allreduce_async(np.ones(2), op=ReduceOp.SUM).wait().tolist() == [n, n]
    core.shutdown()
    core.init()  # MPI stays up between shutdown and init; it is finalized at exit
    assert core.allgather_object(core.rank()) == list(range(n))
    core.shutdown()


def test_init_starts_mpi_where_mpi4py_was_told_not_to(ranks):
    ranks.run(2, [init_starts_mpi_where_mpi4py_was_told_not_to]).assert_passed(
        init_starts_mpi_where_mpi4py_was_told_not_to)


def _threads_finishing(name):
    """The names of the threads that finish the collectives named `name` from now on."""
    from hvdtrain.core.engine import Engine

    threads = []
    finish_all = Engine._finish_all

    def recording(self, entries, *args, **kwargs):
        if any(entry.request.name == name for entry in entries):
            threads.append(threading.current_thread().name)
        return finish_all(self, entries, *args, **kwargs)

    Engine._finish_all = recording
    return threads


def _until_the_engine_thread_waits():
    """Return once the engine's thread is blocked in one of its waits between cycles (a loaded
    machine may start it late, or run its own cycle when a caller arrives)."""
    import sys

    thread = core.running_engine()._thread
    deadline = time.monotonic() + SECONDS_TO_FAIL
    while time.monotonic() < deadline:
        frame, names = sys._current_frames().get(thread.ident), []
        while frame is not None and len(names) < 4:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if names[:1] == ["wait"] and "_run" in names:
            return
        time.sleep(0.001)
    raise AssertionError(f"the engine thread did not wait within {SECONDS_TO_FAIL} s")


def a_caller_waiting_alone_runs_the_cycle_itself_and_with_peers_leaves_it_to_the_engine():
    """HOROVOD_CYCLE_TIME=500 keeps the engine's thread waiting for more tensors, so that a caller
    blocked on a result finds it between cycles: alone, the caller runs the cycle on its own
    thread (Engine.hurry); with other ranks, the engine's thread does."""
    threads = _threads_finishing("waited for")
    core.init()
    n = core.size()
    core.allreduce_async(np.ones(4), name="warm-up").wait()
    for _ in range(3):
        _until_the_engine_thread_waits()
        assert core.allreduce_async(np.ones(4), op=ReduceOp.SUM, name="waited for").wait().tolist() == [n] * 4
    core.shutdown()
    assert threads == ["MainThread" if n == 1 else "hvdtrain-engine"] * 3, threads


def a_cycle_on_the_callers_thread_leaves_its_cuda_device_as_it_was():
    """On the stand-in CuPy with two GPUs: a caller whose current device is the other GPU waits on
    a collective of GPU 0's buffers, which its own thread runs (the first made the device
    backend on the engine's thread); its device stays the other GPU."""
    import os

    from support.devices import fake_gpus

    os.environ["FAKE_GPUS"] = "2"
    threads = _threads_finishing("on gpu 0")
    with fake_gpus("NCCL") as cupy:
        array = cupy.asarray(np.ones(4, np.float32))  # on GPU 0, the current device
        core.allreduce_async(array, op=ReduceOp.SUM, name="first").wait()
        cupy.cuda.runtime.setDevice(1)
        core.allreduce_async(array, op=ReduceOp.SUM, name="on gpu 0").wait()
        assert cupy.cuda.runtime.getDevice() == 1
        assert array.get().tolist() == [1.0] * 4
    assert threads == ["MainThread"], threads


def test_a_caller_waiting_alone_runs_the_cycle_itself(ranks):
    checks = [a_caller_waiting_alone_runs_the_cycle_itself_and_with_peers_leaves_it_to_the_engine,
              a_cycle_on_the_callers_thread_leaves_its_cuda_device_as_it_was]
    job = ranks.alone(checks, env={"HOROVOD_CYCLE_TIME": "500"})
    for check in checks:
        job.assert_passed(check)


def test_with_peers_the_engines_thread_runs_every_cycle(ranks):
    check = a_caller_waiting_alone_runs_the_cycle_itself_and_with_peers_leaves_it_to_the_engine
    ranks.run(2, [check], env={"HOROVOD_CYCLE_TIME": "500"}).assert_passed(check)


def the_engine_thread_waits_with_a_timer_slack_of_1_us():
    """Linux's default slack (50 us) would space the polls of the ranks' agreement 90 to 170 us
    apart. Read with prctl(PR_GET_TIMERSLACK) on the engine thread, in its cycles."""
    import ctypes

    from hvdtrain.core.engine import Engine

    slacks = []
    cycle = Engine._cycle

    def reading(self):
        slacks.append(ctypes.CDLL(None).prctl(30, 0, 0, 0, 0))
        return cycle(self)

    Engine._cycle = reading
    core.init()
    core.allreduce_async(np.ones(4), name="a cycle").wait()
    core.shutdown()
    assert slacks and set(slacks) == {1000}, slacks


def test_the_engine_thread_waits_with_a_timer_slack_of_1_us(ranks):
    check = the_engine_thread_waits_with_a_timer_slack_of_1_us
    ranks.run(2, [check]).assert_passed(check)
