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
