"""Starting and restarting the engine: init() where the script told mpi4py not to initialize MPI,
Horovod variables that hvdtrain ignores, and one process that goes through errors of every kind,
shutdowns and re-inits with static and dynamic process sets, getting exact results throughout."""

import json

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import HorovodInternalError, ProcessSet, ReduceOp, TensorMismatchError
from hvdtrain.core.settings import ignored_variables


def ranks_without_mpi_initialized():
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
    print(f"rank {core.rank()} done", flush=True)


def test_init_starts_mpi_when_mpi4py_was_told_not_to(mpirun):
    result = mpirun(2, ranks_without_mpi_initialized, timeout=60)
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout, result.stdout


# ----------------------------------------------------------------------------- ignored variables


def test_ignored_horovod_variables_are_named_with_the_nearest_known_one():
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_FUSION_TRESHOLD": "1024",
           "HOROVOD_FUSION_THRESHOLD": "1024", "HOROVOD_CYCLE_TIME": "2", "HOROVOD_SOMETHING_ELSE": "x",
           "HVDTRAIN_CHUNK_BYTES": "4096", "PATH": "/bin"}
    assert ignored_variables(env) == [
        "HOROVOD_AUTOTUNE is set but not implemented by hvdtrain; ignored",
        "HOROVOD_FUSION_TRESHOLD is set but is not a Horovod 0.28 variable (did you mean "
        "HOROVOD_FUSION_THRESHOLD?); ignored",
        "HOROVOD_HIERARCHICAL_ALLREDUCE is set but not implemented by hvdtrain; ignored",
        "HOROVOD_SOMETHING_ELSE is set but is not a Horovod 0.28 variable; ignored",
    ]


def ranks_init_twice():
    for _ in range(2):
        core.init()
        core.barrier()
        core.shutdown()


def test_ignored_variables_are_named_once_by_rank_0(mpirun):
    result = mpirun(2, ranks_init_twice, timeout=60,
                    env={"HOROVOD_AUTOTUNE": "1", "HOROVOD_FUSION_TRESHOLD": "1024"})
    assert result.stdout.count("HOROVOD_AUTOTUNE is set but not implemented by hvdtrain; ignored") == 1, result.stdout
    assert result.stdout.count("(did you mean HOROVOD_FUSION_THRESHOLD?); ignored") == 1, result.stdout


# ----------------------------------------------------------------------------- recovery and re-init


def check_works(n, label):
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


def fail_in_many_ways(n, me):
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
        ("adasum", NotImplementedError, lambda: core.allreduce_async(np.ones(2), op=ReduceOp.ADASUM)),
        ("no dynamic sets", ValueError, lambda: core.add_process_set([0, 1])),
    ]
    for label, error, fail in failures:
        with pytest.raises(error):
            fail()
        check_works(n, label)
    first = core.allreduce_async(np.ones(2), name="twice", op=ReduceOp.SUM)
    with pytest.raises(ValueError, match="already in flight"):
        core.allreduce_async(np.ones(2), name="twice")
    assert first.wait().tolist() == [n, n]
    check_works(n, "duplicate name")


def in_static_sets(n, me):
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
    check_works(n, "static sets")
    core.shutdown()
    assert evens.process_set_id is None and odds.process_set_id is None


def in_dynamic_sets(n, me):
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
    check_works(n, "dynamic sets")
    core.shutdown()


def ranks_recover_and_reinit(timeline_folder):
    core.init()
    n, me = core.size(), core.rank()
    fail_in_many_ways(n, me)
    core.shutdown()

    core.init()
    check_works(n, "after re-init")
    core.shutdown()
    with pytest.raises(ValueError, match="not been initialized"):
        core.allreduce_async(np.ones(1))

    in_static_sets(n, me)
    in_dynamic_sets(n, me)

    # Rank 1 shuts down while the others wait for it; they find their engine stopped, and all
    # start again without a shutdown() of their own.
    pair = ProcessSet([0, 1])
    core.init(process_sets=[pair])
    if me == 1:
        core.shutdown()
    else:
        with pytest.raises(HorovodInternalError, match="shut down"):
            core.allreduce_async(np.ones(1), name="orphan").wait()
    core.init()
    assert pair.process_set_id is None, "the sets of the stopped engine were not released"
    check_works(n, "after a peer's shutdown")
    core.shutdown()

    # Again the static sets, now that sets 1 to 3 were registered before: ids start at 1.
    in_static_sets(n, me)
    core.init()
    core.start_timeline(f"{timeline_folder}/after.json")
    check_works(n, "final")
    core.stop_timeline()
    fail_in_many_ways(n, me)
    core.shutdown()


def test_errors_shutdowns_and_reinits_leave_a_clean_engine(mpirun, tmp_path):
    mpirun(3, ranks_recover_and_reinit, tmp_path, timeout=300)
    # The re-started engine numbered its unnamed collectives from 1 again, as every rank did.
    text = (tmp_path / "after.json").read_text()
    rows = {e["args"]["name"] for e in json.loads(text) if e["name"] == "process_name"}
    assert "allreduce.noname.1" in rows and "allgather.noname.1_0" in rows, sorted(rows)
