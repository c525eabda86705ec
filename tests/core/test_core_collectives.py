"""allgather, broadcast, alltoall, barrier, join, the object collectives and the topology, on
real ranks (and alone, as a job of size 1), against what every rank's known inputs make; and the
Handle every collective returns."""

import time

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import ReduceOp
from hvdtrain.core.requests import numpy_dtype

DTYPES = ("uint8", "int64", "float16", "bfloat16", "float64")


def rank_data(rank, shape, dtype, salt=0):
    """Rank `rank`'s tensor: small integers, exact in every dtype, that differ by rank and position."""
    values = (np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int32) + 37 * rank + 11 * salt) % 100
    return values.reshape(shape).astype(numpy_dtype(dtype))


def check_allgather(n, me):
    rows = [(0, 3, 1, 2)[r % 4] for r in range(n)]  # rank 0 contributes no rows
    for d, dtype in enumerate(DTYPES):
        for trailing in ((), (2,), (2, 3)):
            got = core.allgather_async(rank_data(me, (rows[me],) + trailing, dtype, d),
                                       name=f"gather.{dtype}.{len(trailing)}").wait()
            expected = np.concatenate([rank_data(r, (rows[r],) + trailing, dtype, d) for r in range(n)])
            assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape)
            assert np.array_equal(got, expected), f"allgather {dtype} {trailing}: {got} != {expected}"


def check_broadcast(n, me):
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


def check_alltoall(n, me):
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


def check_barrier(n, me):
    """Nobody leaves the barrier before the last rank has arrived."""
    time.sleep(0.1 * me)
    arrived = time.time()
    core.barrier()
    left = time.time()
    arrivals = core.allgather_async(np.array([arrived]), name="barrier.arrivals").wait()
    assert left >= arrivals.max(), f"rank {me} left the barrier at {left}, before the last arrival {arrivals.max()}"


def check_join(n, me):
    """Ranks run out of data after different numbers of steps; the others go on reducing, with
    the joined ranks contributing zeros and AVERAGE still dividing by the size."""
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


def check_objects(n, me):
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


def check_topology(n, me):
    """Every rank runs on this one host."""
    topology = core.topology()
    assert (core.size(), core.rank()) == (n, me)
    assert (core.local_size(), core.local_rank()) == (n, me)
    assert (core.cross_size(), core.cross_rank()) == (1, 0)
    assert core.is_homogeneous()
    assert len(set(topology.hosts)) == 1 and len(topology.hosts) == n, topology.hosts
    assert core.allgather_object(topology, name="topology") == [
        topology.__class__(**{**vars(topology), "rank": r, "local_rank": r}) for r in range(n)]


def ranks_collectives():
    core.init()
    n, me = core.size(), core.rank()
    check_topology(n, me)
    check_allgather(n, me)
    check_broadcast(n, me)
    check_alltoall(n, me)
    check_barrier(n, me)
    check_join(n, me)
    check_objects(n, me)


@pytest.mark.parametrize("num_proc", [2, 3, 4])
def test_collectives(mpirun, num_proc):
    mpirun(num_proc, ranks_collectives, timeout=120)


def test_collectives_alone(alone):
    alone(ranks_collectives)


def alone_blocked_caller_is_not_kept_waiting():
    """HOROVOD_CYCLE_TIME=500: the engine waits half a second for more tensors to fuse, unless a
    caller blocks on a result, which ends that wait. Both ranks' waits are timed: a collective
    submitted and left alone is not hurried."""
    import numpy as np

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
    print(f"waited {waited:.3f} left alone {left_alone:.3f}")
    assert waited < 0.2 <= 0.4 < left_alone, (waited, left_alone)


def test_a_blocked_caller_ends_the_engines_wait_for_more_tensors(alone):
    alone(alone_blocked_caller_is_not_kept_waiting, env={"HOROVOD_CYCLE_TIME": "500"})


def test_a_handle_wakes_every_thread_waiting_on_it_and_gives_them_the_error():
    import threading

    from hvdtrain.core.requests import Handle

    handle, failed = Handle("late"), Handle("failed")
    results = []
    waiting = [threading.Thread(target=lambda: results.append(handle.wait()), daemon=True) for _ in range(3)]
    for thread in waiting:
        thread.start()
    time.sleep(0.2)  # let the threads block before the result arrives
    assert not handle.poll() and results == []
    handle._finish("result")
    for thread in waiting:
        thread.join(timeout=5)
    assert results == ["result"] * 3
    assert handle.poll() and handle.wait() == "result"
    failed._finish(error=ValueError("from the engine"))
    with pytest.raises(ValueError, match="from the engine"):
        failed.synchronize()
