"""Process sets on real ranks (hvdtrain/core/process_sets.py): collectives among some of the ranks
give exactly the result of those ranks' inputs, run beside the global set's and other sets'
collectives of the same names; sets made from mpi4py communicators, and sets of all ranks, are
registered as Horovod registers them; and bad use (a rank outside the set, a root outside it,
ranks registering different sets, a set given twice, a communicator's set not passed by its
members) fails on every rank concerned instead of hanging. What is refused before any rank waits is in
tests/single/core/test_process_sets.py."""

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import ProcessSet, ReduceOp, TensorMismatchError
from hvdtrain.core.process_sets import process_set_by_id


def data(rank, salt=0):
    return (np.arange(6, dtype=np.float64) + 10 * rank + 100 * salt).reshape(3, 2)


def world():
    """(size, rank) of the job, before the engine starts."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()


def collectives_in_process_sets_involve_their_members_only():
    n, me = world()
    evens, odds = ProcessSet(range(0, n, 2)), ProcessSet(range(1, n, 2))
    allbutlast = ProcessSet(range(n - 1))
    core.init(process_sets=[evens, odds, allbutlast])
    mine = evens if me % 2 == 0 else odds
    other = odds if mine is evens else evens
    assert [s.process_set_id for s in (evens, odds, allbutlast)] == [1, 2, 3]
    assert core.global_process_set.ranks == list(range(n)) and core.global_process_set.size() == n
    assert (mine.included(), other.included()) == (True, False)
    assert mine.size() == len(mine.ranks) and mine.rank() == mine.ranks.index(me) and other.rank() is None

    # The same name in flight in the global set, this rank's set and the overlapping one.
    in_world = core.allreduce_async(data(me), name="x", op=ReduceOp.SUM)
    in_mine = core.allreduce_async(data(me), name="x", op=ReduceOp.SUM, process_set=mine)
    in_overlap = (core.allreduce_async(data(me), name="x", op=ReduceOp.MAX, process_set=allbutlast)
                  if allbutlast.included() else None)
    assert np.array_equal(in_world.wait(), sum(data(r) for r in range(n)))
    assert np.array_equal(in_mine.wait(), sum(data(r) for r in mine.ranks))
    if in_overlap is not None:
        assert np.array_equal(in_overlap.wait(), data(n - 2))

    average = core.allreduce_async(data(me), name="avg", process_set=mine).wait()
    assert np.allclose(average, sum(data(r) for r in mine.ranks) / mine.size())
    grouped = core.grouped_allreduce_async([data(me), data(me, 1)], name="g", op=ReduceOp.SUM,
                                           process_set=mine)
    assert all(np.array_equal(h.wait(), sum(data(r, s) for r in mine.ranks)) for s, h in enumerate(grouped))

    rows = np.full((me + 1, 2), me, np.int64)  # a different number of rows per rank
    gathered = core.allgather_async(rows, name="gather", process_set=mine).wait()
    assert np.array_equal(gathered, np.concatenate([np.full((r + 1, 2), r, np.int64) for r in mine.ranks]))

    root = mine.ranks[-1]  # a job rank, not a position in the set
    assert np.array_equal(core.broadcast_async(data(me), root, name="bcast", process_set=mine).wait(), data(root))

    sent = np.repeat(np.arange(mine.size()) + 10 * me, 2)  # two rows for each member
    received, splits = core.alltoall_async(sent, name="a2a", process_set=mine).wait()
    assert splits.tolist() == [2] * mine.size()
    assert received.tolist() == [10 * r + mine.rank() for r in mine.ranks for _ in range(2)]

    scattered = core.reducescatter_async(np.arange(2 * mine.size(), dtype=np.float64) * (me + 1), name="rs",
                                         op=ReduceOp.SUM, process_set=mine).wait()
    total = sum(r + 1 for r in mine.ranks)
    assert scattered.tolist() == [total * (2 * mine.rank()), total * (2 * mine.rank() + 1)]

    # Unnamed object collectives are counted per set: the global call after them still matches.
    assert core.allgather_object(f"r{me}", process_set=mine) == [f"r{r}" for r in mine.ranks]
    assert core.broadcast_object(me if me == root else None, root_rank=root, process_set=mine) == root
    assert core.allgather_object(me) == list(range(n))
    core.barrier(process_set=mine)
    core.shutdown()
    assert evens.process_set_id is None and odds.process_set_id is None


def a_rank_or_root_outside_a_process_set_is_refused():
    n, me = world()
    evens, odds = ProcessSet(range(0, n, 2)), ProcessSet(range(1, n, 2))
    core.init(process_sets=[evens, odds])
    mine, other = (evens, odds) if me % 2 == 0 else (odds, evens)
    with pytest.raises(ValueError, match=rf"rank {me} is not a member of process set {other.process_set_id}"):
        core.allreduce_async(data(me), name="outside", process_set=other)
    with pytest.raises(ValueError, match=rf"root_rank {other.ranks[0]} is not a rank of process set"):
        core.broadcast_async(data(me), other.ranks[0], name="foreign root", process_set=mine)
    with pytest.raises(ValueError, match="needs dynamic process sets"):
        core.add_process_set([0])
    core.shutdown()


def sets_made_from_communicators_are_registered_on_every_rank():
    """Horovod's example: each rank passes the set of its own communicator (even or odd ranks),
    and every rank registers both, in job-rank order whatever the communicator's order."""
    from mpi4py import MPI

    n, me = world()
    halves = MPI.COMM_WORLD.Split(color=me % 2, key=-me)  # the key reverses the order: ranks stay the job's
    mine = ProcessSet(halves)
    assert mine.ranks is None and mine.size() is None
    core.init(process_sets=[ProcessSet([0, 1]), mine])
    assert mine.ranks == list(range(me % 2, n, 2)) and mine.process_set_id == 2 + me % 2
    other = process_set_by_id(3 - me % 2)
    assert other.ranks == list(range(1 - me % 2, n, 2)) and other.included() is False
    assert mine.rank() == mine.ranks.index(me)
    summed = core.allreduce_async(data(me), name="x", op=ReduceOp.SUM, process_set=mine).wait()
    assert np.array_equal(summed, sum(data(r) for r in mine.ranks))
    gathered = core.allgather_async(np.full((1, 2), me), name="g", process_set=mine).wait()
    assert gathered[:, 0].tolist() == mine.ranks
    with pytest.raises(ValueError, match=rf"rank {me} is not a member of process set {other.process_set_id}"):
        core.allreduce_async(data(me), name="outside", process_set=other)
    core.shutdown()


def _refused_at_init_on_every_rank(sets, expected):
    """init(process_sets=sets) fails the same way on every rank, before starting anything, and
    every rank may initialize again."""
    n, me = world()
    with pytest.raises(ValueError, match=expected):
        core.init(process_sets=sets)
    assert not core.is_initialized()
    core.init()
    assert core.allgather_object(me) == list(range(n))
    core.shutdown()


def a_communicators_set_not_passed_by_a_member_is_refused_on_every_rank():
    from mpi4py import MPI

    n, me = world()
    pair = MPI.COMM_WORLD.Split(color=0 if me < 2 else MPI.UNDEFINED, key=me)
    _refused_at_init_on_every_rank([ProcessSet(pair)] if me == 0 else [],
                                   r"ranks \[0, 1\], made from an MPI communicator, was passed to init\(\) by "
                                   r"rank\(s\) \[0\] but not by its member\(s\) \[1\]")


def a_communicators_set_passed_by_a_rank_outside_it_is_refused_on_every_rank():
    from mpi4py import MPI

    n, me = world()
    pair = MPI.COMM_WORLD.Split(color=0 if me < 2 else MPI.UNDEFINED, key=me)
    # COMM_NULL on the ranks outside the pair
    _refused_at_init_on_every_rank([ProcessSet(pair)], rf"rank {n - 1}: its ProcessSet was made from MPI.COMM_NULL")


def sets_of_all_ranks_are_the_global_set_and_the_order_of_ranks_does_not_matter():
    """Horovod's static rule: lists of ranks are process sets too, their order does not matter, and
    a set of all ranks (a list or a communicator) is the global set, not registered again; every
    object given gets the id of the set registered with its ranks, and works as that set."""
    from mpi4py import MPI

    n, me = world()
    rest = ProcessSet(list(range(1, n)) if me == 0 else list(reversed(range(1, n))))
    whole = ProcessSet(MPI.COMM_WORLD)
    core.init(process_sets=[[0], rest, list(range(n - 1, -1, -1)), whole])
    assert [process_set_by_id(i).ranks for i in (0, 1, 2)] == [list(range(n)), [0], list(range(1, n))]
    with pytest.raises(ValueError, match="no process set with id 3"):
        process_set_by_id(3)
    assert (rest.process_set_id, whole.process_set_id) == (2, 0)
    expected = sum(data(r) for r in range(1, n)).tolist()
    if me:
        assert core.allreduce_async(data(me), name="rest", op=ReduceOp.SUM,
                                    process_set=rest).wait().tolist() == expected
    assert core.allreduce_async(data(me), name="all", op=ReduceOp.SUM, process_set=whole).wait().tolist() == \
        sum(data(r) for r in range(n)).tolist()
    core.shutdown()


def a_set_given_twice_is_refused_on_every_rank():
    _refused_at_init_on_every_rank([[0], [1, 2], ProcessSet([0])],
                                   r"rank 0 passed the process set of ranks \[0\] twice \(entries 0 and 2\)")


def a_mismatch_inside_a_process_set_names_the_ranks_of_the_job():
    odds = ProcessSet([1, 3])
    core.init(process_sets=[odds])
    me = core.rank()
    if odds.included():
        with pytest.raises(TensorMismatchError) as raised:
            core.allreduce_async(np.ones(2 + me), name="bad", process_set=odds).wait()
        assert set(raised.value.values_by_rank) == {1, 3}, raised.value.values_by_rank
        assert "rank 1: (3,)" in str(raised.value) and "rank 3: (5,)" in str(raised.value), raised.value
    assert core.allgather_object(me) == [0, 1, 2, 3]  # the others were never held up
    core.shutdown()


ON_THREE_OR_FOUR_RANKS = [collectives_in_process_sets_involve_their_members_only,
                          a_rank_or_root_outside_a_process_set_is_refused,
                          sets_made_from_communicators_are_registered_on_every_rank,
                          sets_of_all_ranks_are_the_global_set_and_the_order_of_ranks_does_not_matter]
ON_THREE_RANKS = [a_communicators_set_not_passed_by_a_member_is_refused_on_every_rank,
                  a_communicators_set_passed_by_a_rank_outside_it_is_refused_on_every_rank,
                  a_set_given_twice_is_refused_on_every_rank]
ON_FOUR_RANKS = [a_mismatch_inside_a_process_set_names_the_ranks_of_the_job]


def job(ranks, num_proc):
    return ranks.run(num_proc, ON_THREE_OR_FOUR_RANKS + (ON_THREE_RANKS if num_proc == 3 else ON_FOUR_RANKS))


@pytest.mark.parametrize("num_proc", [3, 4])
@pytest.mark.parametrize("check", ON_THREE_OR_FOUR_RANKS, ids=lambda check: check.__name__)
def test_process_sets_on_real_ranks(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("check", ON_THREE_RANKS, ids=lambda check: check.__name__)
def test_bad_sets_from_communicators_fail_on_every_rank(ranks, check):
    job(ranks, 3).assert_passed(check)


def test_a_mismatch_inside_a_process_set_names_the_ranks_of_the_job(ranks):
    job(ranks, 4).assert_passed(a_mismatch_inside_a_process_set_names_the_ranks_of_the_job)


# ----------------------------------------------------------------------------- dynamic sets


def dynamic_process_sets_are_added_checked_and_removed_on_every_rank():
    """HOROVOD_DYNAMIC_PROCESS_SETS=1."""
    core.init()
    n, me = core.size(), core.rank()
    ends = core.add_process_set([0, n - 1])
    assert ends.process_set_id == 1 and isinstance(ends, ProcessSet)
    if ends.included():
        assert core.allreduce_async(data(me), name="e", op=ReduceOp.SUM, process_set=ends).wait().tolist() == \
            (data(0) + data(n - 1)).tolist()
    with pytest.raises(ValueError, match=r"already registered"):
        core.add_process_set(ProcessSet([n - 1, 0]))
    with pytest.raises(ValueError, match=rf"must be a non-empty list of ranks of this job \(0 to {n - 1}\)"):
        core.add_process_set([0, n])
    with pytest.raises(ValueError, match=r"rank 0: \[0\]; rank 1: \[1\]"):
        core.add_process_set([min(me, 1)])  # rank 0 asks for [0], the others for [1]
    assert core.remove_process_set(ends) is True and ends.process_set_id is None
    assert core.remove_process_set(ends) is False and core.remove_process_set(core.global_process_set) is False
    with pytest.raises(ValueError, match="is not registered"):
        core.allreduce_async(data(me), name="gone", process_set=ends)
    again = core.add_process_set([0, n - 1])  # the same ranks may be registered again once removed
    assert again.process_set_id == 2
    if again.included():
        core.barrier(process_set=again)
    core.shutdown()
    with pytest.raises(ValueError, match="not been initialized"):
        core.allreduce_async(data(me), name="late", process_set=again)


def test_dynamic_process_sets_are_added_checked_and_removed_on_every_rank(ranks):
    ranks.run(3, [dynamic_process_sets_are_added_checked_and_removed_on_every_rank],
              env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}).assert_passed(
        dynamic_process_sets_are_added_checked_and_removed_on_every_rank)
