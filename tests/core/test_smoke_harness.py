import numpy as np
import pytest


def ranks_sum_of_ranks():
    from hvdtrain import core

    core.init()
    n = core.size()
    got = core.allreduce_async(np.full(5, core.rank(), np.int64), name="r", op=core.ReduceOp.SUM).wait()
    assert got.tolist() == [n * (n - 1) // 2] * 5, got


@pytest.mark.parametrize("num_proc", [2, 3])
def test_sum_of_ranks(mpirun, num_proc):
    mpirun(num_proc, ranks_sum_of_ranks)
