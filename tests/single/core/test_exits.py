"""The status a rank exits with after an error (hvdtrain/core/exits.py), from which the supervisor
decides whether a restart can help: a failed collective (a peer gone), whether raised as itself,
as the cause of another error, or in TensorFlow's text of it, is one; ranks that disagree on a
tensor, or any other error, would meet it again."""

import pytest

from hvdtrain.core import exits
from hvdtrain.core.exceptions import HorovodInternalError, TensorMismatchError


def raised(error, cause=None):
    """`error` as an except clause catches it: raised from `cause` where one is given."""
    try:
        try:
            raise cause or error
        except BaseException as first:
            if cause is None:
                raise
            raise error from first
    except BaseException as final:
        return final


@pytest.mark.parametrize("error,status", [
    (raised(HorovodInternalError("peer gone")), exits.EXIT_COMMUNICATION),
    (raised(RuntimeError("in a hook"), HorovodInternalError("x")), 75),
    (raised(RuntimeError("UnknownError: HorovodInternalError: x")), 75),
    (raised(TensorMismatchError("shapes differ")), exits.EXIT_RANK_ERROR),
    (raised(ValueError("bad data")), exits.EXIT_RANK_ERROR),
], ids=["a failed collective", "an error caused by a failed collective", "tensorflow's text of a failed collective",
        "ranks that disagree", "any other error"])
def test_ranks_exit_with_a_status_that_says_whether_a_restart_can_help(error, status):
    assert exits.exit_status(error) == status
