"""cupy.cuda.nccl over MPI: the communicator moves the bytes at the pointers it is given. Calls
between groupStart and groupEnd run at groupEnd, sends and receives as nonblocking pairs, as
NCCL runs a group together."""

import ctypes
import os

import numpy as np

available = True
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = range(5)
NCCL_FLOAT32 = 7
_TYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64, 6: np.float16,
          7: np.float32, 8: np.float64}
_group = None  # calls deferred until groupEnd, or None outside a group


class NcclError(RuntimeError):
    pass


def get_version():
    return 23007


def get_unique_id():
    return os.urandom(128)


def groupStart():
    global _group
    _group = []


def groupEnd():
    global _group
    calls, _group = _group, None
    requests = []
    for call in calls:
        requests.extend(call() or [])
    from mpi4py import MPI

    MPI.Request.Waitall(requests)


def _array(ptr, count, datatype):
    if datatype == 9:  # bfloat16
        import ml_dtypes

        dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        dtype = np.dtype(_TYPES[datatype])
    if count == 0:
        return np.empty(0, dtype)
    return np.ctypeslib.as_array((ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)).view(dtype)


def _reduce(arrays, op):
    wide = np.stack([a.astype(np.float64) if a.dtype.kind in "fV" else a for a in arrays])
    reduced = {NCCL_SUM: wide.sum(0), NCCL_PROD: wide.prod(0), NCCL_MAX: wide.max(0), NCCL_MIN: wide.min(0),
               NCCL_AVG: wide.sum(0) / len(arrays)}[op]
    return reduced.astype(arrays[0].dtype)


class NcclCommunicator:
    def __init__(self, ndev, unique_id, rank):
        from mpi4py import MPI

        assert len(unique_id) == 128
        self._comm = MPI.COMM_WORLD.Split(0, rank)  # the job's ranks, in the communicator's order
        assert self._comm.Get_size() == ndev and self._comm.Get_rank() == rank
        ids = self._comm.allgather(unique_id)
        assert all(i == unique_id for i in ids), "ranks were given different unique ids"

    def _run(self, call):
        if _group is None:
            from mpi4py import MPI

            MPI.Request.Waitall(call() or [])
        else:
            _group.append(call)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        def call():
            gathered = self._comm.allgather(_array(sendbuf, count, datatype).copy())
            _array(recvbuf, count, datatype)[...] = _reduce(gathered, op)
        self._run(call)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        def call():
            gathered = self._comm.gather(_array(sendbuf, count, datatype).copy(), root=root)
            if self._comm.Get_rank() == root:
                _array(recvbuf, count, datatype)[...] = _reduce(gathered, op)
        self._run(call)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        def call():
            rank, size = self._comm.Get_rank(), self._comm.Get_size()
            gathered = self._comm.allgather(_array(sendbuf, recvcount * size, datatype).copy())
            reduced = _reduce(gathered, op)
            _array(recvbuf, recvcount, datatype)[...] = reduced[rank * recvcount:(rank + 1) * recvcount]
        self._run(call)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        def call():
            source = _array(sendbuff, count, datatype).copy() if self._comm.Get_rank() == root else None
            _array(recvbuff, count, datatype)[...] = self._comm.bcast(source, root=root)
        self._run(call)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        def call():
            gathered = self._comm.allgather(_array(sendbuf, count, datatype).copy())
            _array(recvbuf, count * len(gathered), datatype)[...] = np.concatenate(gathered)
        self._run(call)

    def send(self, sendbuf, count, datatype, peer, stream):
        self._run(lambda: [self._comm.Isend(_array(sendbuf, count, datatype).copy(), dest=peer)])

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._run(lambda: [self._comm.Irecv(_array(recvbuf, count, datatype), source=peer)])

    def check_async_error(self):
        pass

    def abort(self):
        self._comm.Free()

    def destroy(self):
        self._comm.Free()
