"""Process sets refused before any rank waits (hvdtrain/core/process_sets.py, init()): a bad
ProcessSet when it is made, and process_sets that are not a list of them. Process sets on real
ranks are in tests/parallel/core/test_process_sets.py."""

import pytest

from hvdtrain import core
from hvdtrain.core import ProcessSet


@pytest.mark.parametrize("ranks, message", [
    ("01", "must be integers"),
    ([0, 1.5], "must be integers"),
    ([1, 1], "must be distinct"),
    (3, "made from a list of ranks or an mpi4py communicator, got int"),
])
def test_a_bad_process_set_is_refused_when_made(ranks, message):
    with pytest.raises(ValueError, match=message):
        ProcessSet(ranks)


@pytest.mark.parametrize("process_sets", [ProcessSet([0, 1]), "static", 3])
def test_init_refuses_process_sets_that_are_not_a_list_of_process_sets(process_sets):
    with pytest.raises(ValueError, match=r"takes a list of process sets or 'dynamic', got "):
        core.init(process_sets=process_sets)
    assert not core.is_initialized()


def test_a_set_given_twice_at_init_is_refused_naming_both_entries():
    from hvdtrain.core.process_sets import _agree

    asked = [[("ranks", [0]), ("ranks", [1, 2]), ("ranks", [0])]] * 3  # what each of 3 ranks passed
    with pytest.raises(ValueError, match=r"rank 0 passed the process set of ranks \[0\] twice \(entries 0 and 2\)"):
        _agree(asked, 1, 3, at_init=True)


def test_sets_of_all_ranks_at_init_are_the_global_set_however_often_given():
    from hvdtrain.core.process_sets import _agree

    asked = [[("ranks", [0, 1, 2]), ("ranks", [1, 2]), ("comm", [0, 1, 2])]] * 3
    assert _agree(asked, 1, 3, at_init=True) == [[1, 2]]
