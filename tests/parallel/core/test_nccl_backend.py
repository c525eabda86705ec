"""The NCCL backend's agreement over MPI on real ranks (hvdtrain/core/nccl_backend.py): every rank
learns that one of them cannot start NCCL, and NCCL's unique id is made by rank 0 and reaches every
rank (with the real CuPy and NCCL, where the `gpu` extra is installed). Its plans are in
tests/single/core/test_nccl_backend.py; its collectives on the stand-in CuPy in test_backend.py."""

import importlib.util

import pytest

from hvdtrain.core.exceptions import HorovodInternalError
from hvdtrain.core.nccl_backend import agree_to_start, exchange_unique_id

CUPY = importlib.util.find_spec("cupy") is not None


def every_rank_learns_that_one_cannot_start_nccl():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    assert agree_to_start(comm, lambda: rank * 10, "NCCL") == [0, 10, 20]

    def fails_on_rank_1():
        if rank == 1:
            raise RuntimeError("CuPy cannot load the NCCL library")
        return rank

    with pytest.raises(HorovodInternalError) as raised:
        agree_to_start(comm, fails_on_rank_1, "NCCL")
    assert str(raised.value) == "NCCL cannot start: rank 1: CuPy cannot load the NCCL library", raised.value


def nccls_unique_id_is_made_by_rank_0_and_reaches_every_rank():
    from mpi4py import MPI

    from hvdtrain.core import cuda

    comm = MPI.COMM_WORLD
    nccl = cuda.nccl()
    first, second = exchange_unique_id(comm, nccl), exchange_unique_id(comm, nccl)
    assert isinstance(first, bytes) and len(first) == 128 and first != second
    ids = comm.allgather((first, second))
    assert all(pair == ids[0] for pair in ids), "ranks got different unique ids"


CHECKS = [every_rank_learns_that_one_cannot_start_nccl] + ([nccls_unique_id_is_made_by_rank_0_and_reaches_every_rank]
                                                           if CUPY else [])


def test_every_rank_learns_that_one_cannot_start_nccl(ranks):
    ranks.run(3, CHECKS).assert_passed(every_rank_learns_that_one_cannot_start_nccl)


@pytest.mark.skipif(not CUPY, reason="needs CuPy (pip install 'hvdtrain[gpu]')")
def test_nccls_unique_id_is_made_by_rank_0_and_reaches_every_rank(ranks):
    ranks.run(3, CHECKS).assert_passed(nccls_unique_id_is_made_by_rank_0_and_reaches_every_rank)
