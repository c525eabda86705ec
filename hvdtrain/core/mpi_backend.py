"""Collectives on NumPy buffers in host memory, through MPI: the engine's backend for the CPU
(backend.py), and the transport of the host-staged GPU path (staged_backend.py).
"""

import time

import numpy as np

from . import adasum
from .fusion import Pack, pack_capacity_bytes, plan_allreduce
from .requests import ReduceOp

REDUCIBLE_DTYPES = frozenset(
    ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
)


def _scale(destination, factor, source=None):
    """`destination` = `source` (default: itself) times `factor`, as Horovod scales buffers:
    integers in float64, truncated toward zero; float32 and float64 in their own precision; 16-bit
    floats in float32. In their own precision the factor alone would be rounded to 11 bits
    (float16) or 8 (bfloat16) before any product, an error as large as the rounding of the
    result itself."""
    source = destination if source is None else source
    if destination.itemsize == 2 and destination.dtype.kind in "fV":  # float16, ml_dtypes' bfloat16
        np.multiply(source, np.float32(factor), out=destination, dtype=np.float32, casting="unsafe")
    else:
        np.multiply(source, factor, out=destination, casting="unsafe")


def _mpi_has_float16(MPI):
    """Whether this MPI library has a datatype that mpi4py gives NumPy's float16 (asked for by
    duplicating it, which an MPI without one refuses with MPI_ERR_TYPE)."""
    from mpi4py.util import dtlib

    try:
        datatype = dtlib.from_numpy_dtype(np.float16)
    except (KeyError, ValueError, TypeError, MPI.Exception):
        return False
    datatype.Free()
    return True


def _byte_view(array):
    return array.reshape(-1).view(np.uint8)


class MpiBackend:
    transport = "MPI"  # the timeline's name for its calls

    def __init__(self, comm, settings, adasum_hosts=None):
        """`adasum_hosts`: None, or the communicators of this rank's host and of one rank a
        host (local, cross), for Adasum as Horovod's NCCL build runs it on device buffers: an
        average within each host, then Adasum across hosts."""
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm
        self.settings = settings
        self._ops = {
            ReduceOp.SUM: MPI.SUM,
            ReduceOp.AVERAGE: MPI.SUM,  # the engine folds 1/size into the postscale factor
            ReduceOp.MIN: MPI.MIN,
            ReduceOp.MAX: MPI.MAX,
            ReduceOp.PRODUCT: MPI.PROD,
        }
        self._words_ops = {}  # (dtype, op) -> the user-defined op of _words_op
        self._has_float16 = _mpi_has_float16(MPI)
        self._fusion_buffer = np.empty(0, np.uint8)
        self._adasum_within_host = None if adasum_hosts is None else MpiBackend(adasum_hosts[0], settings)
        self._adasum_comm = comm if adasum_hosts is None else adasum_hosts[1]
        self._adasum_comms = None  # adasum.level_communicators, made by the first Adasum

    # MPI has no bfloat16, and an MPI without an extension for float16 (Open MPI 5 has
    # MPI_SHORT_FLOAT) none for that either: those are reduced as 16-bit words with a user-defined
    # op that computes in float32 (NumPy's float16, ml_dtypes' bfloat16).
    def _words_op(self, dtype, op):
        mpi_op = self._words_ops.get((dtype, op))
        if mpi_op is None:
            ufunc = {ReduceOp.SUM: np.add, ReduceOp.AVERAGE: np.add, ReduceOp.MIN: np.minimum,
                     ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}[op]

            def reduce_words(incoming, inout, datatype):
                ufunc(np.frombuffer(incoming, dtype), np.frombuffer(inout, dtype), out=np.frombuffer(inout, dtype))

            mpi_op = self._words_ops[(dtype, op)] = self._MPI.Op.Create(reduce_words, commute=True)
        return mpi_op

    def _operands(self, array, op):
        # Of the reducible dtypes only ml_dtypes' bfloat16 is of kind "V", and float16 is the
        # only float of 2 bytes. Not `dtype.name`: NumPy builds that string on every call (5 us,
        # measured), and this runs for every piece.
        if array.dtype.kind == "V" or (array.itemsize == 2 and array.dtype.kind == "f" and not self._has_float16):
            return [array.view(np.uint16), self._MPI.UINT16_T], self._words_op(array.dtype, op)
        return array, self._ops[op]

    def _reduce_in_place(self, array, op):
        buffer, mpi_op = self._operands(array, op)
        self.comm.Allreduce(self._MPI.IN_PLACE, buffer, mpi_op)

    def _reduce_scaled_in_place(self, array, op, postscale):
        self._reduce_in_place(array, op)
        if postscale != 1.0:
            # Average is a sum scaled by 1/size. Scaling each piece as soon as it is reduced, while
            # it is still in cache, costs a fraction of one more pass over the whole result (178 MB
            # at 2 ranks: 63 ms against 50 ms for the plain sum), and measured as fast as a ring of
            # our own that scaled each rank's finished segment, or faster (docs/benchmarks.md).
            # Every rank scales the same sum alike, so all get the same bits.
            _scale(array, postscale)

    def _reduce_into(self, source, destination, op):
        send, mpi_op = self._operands(source, op)
        receive, _ = self._operands(destination, op)
        self.comm.Allreduce(send, receive, mpi_op)

    def _fusion_window(self, dtype, elements):
        nbytes = elements * dtype.itemsize
        if self._fusion_buffer.nbytes < nbytes:
            self._fusion_buffer = np.empty(max(nbytes, pack_capacity_bytes(self.settings)), np.uint8)
        return self._fusion_buffer[:nbytes].view(dtype)

    # Host buffers are ready when submitted and done when a call returns.
    def start(self, entries):
        pass

    def finish(self, entries):
        return None

    def check(self):
        pass

    def close(self):
        for comm in self._adasum_comms or ():
            comm.Free()
        self._adasum_comms = None

    def zeros(self, elements, dtype):
        return np.zeros(elements, dtype)

    def allreduce(self, sources, destinations, op, prescale, postscale, record=None):
        """Reduce flat arrays `sources[i]` into `destinations[i]` (the same array when in place).
        `record(phase, start, end, indices)` receives timings for the timeline."""
        if op == ReduceOp.ADASUM:
            self._adasum(sources, destinations, prescale, postscale, record)
            return
        settings = self.settings
        if op == ReduceOp.AVERAGE:
            postscale /= self.comm.Get_size()
        dtype = destinations[0].dtype
        plan = plan_allreduce(tuple(d.size for d in destinations), dtype.itemsize, settings.chunk_bytes,
                              settings.pack_below_bytes, pack_capacity_bytes(settings))
        for step in plan:
            if isinstance(step, Pack):
                self._reduce_pack(step, sources, destinations, op, prescale, postscale, record)
                continue
            source = sources[step.index][step.start:step.stop]
            destination = destinations[step.index][step.start:step.stop]
            started = time.perf_counter() if record else 0.0
            if prescale != 1.0:
                _scale(destination, prescale, source)
                self._reduce_scaled_in_place(destination, op, postscale)
            elif sources[step.index] is destinations[step.index]:
                self._reduce_scaled_in_place(destination, op, postscale)
            else:
                self._reduce_into(source, destination, op)
                if postscale != 1.0:
                    _scale(destination, postscale)
            if record:
                record("MPI_ALLREDUCE", started, time.perf_counter(), (step.index,))

    def _reduce_pack(self, pack, sources, destinations, op, prescale, postscale, record):
        window = self._fusion_window(destinations[0].dtype, pack.elements)
        t0 = time.perf_counter() if record else 0.0
        offset = 0
        for index in pack.indices:
            source = sources[index]
            segment = window[offset:offset + source.size]
            if prescale != 1.0:
                _scale(segment, prescale, source)
            else:
                segment[...] = source
            offset += source.size
        t1 = time.perf_counter() if record else 0.0
        self._reduce_scaled_in_place(window, op, postscale)
        t2 = time.perf_counter() if record else 0.0
        offset = 0
        for index in pack.indices:
            destination = destinations[index]
            destination[...] = window[offset:offset + destination.size]
            offset += destination.size
        if record:
            t3 = time.perf_counter()
            record("MEMCPY_IN_FUSION_BUFFER", t0, t1, pack.indices)
            record("MPI_ALLREDUCE", t1, t2, pack.indices)
            record("MEMCPY_OUT_FUSION_BUFFER", t2, t3, pack.indices)

    def _adasum(self, sources, destinations, prescale, postscale, record):
        """Adasum combines each tensor by its own dot products, so several tensors go through
        the fusion buffer together with their sizes, whatever their number and size; one is
        combined where its result goes."""
        if self._adasum_comms is None:
            self._adasum_comms = adasum.level_communicators(self._adasum_comm)
        sizes = [source.size for source in sources]
        t0 = time.perf_counter() if record else 0.0
        if len(sources) == 1:
            window = destinations[0]
            if prescale != 1.0 or window is not sources[0]:
                _scale(window, prescale, sources[0])
        else:
            window = self._fusion_window(destinations[0].dtype, sum(sizes))
            offset = 0
            for source in sources:
                _scale(window[offset:offset + source.size], prescale, source)
                offset += source.size
        t1 = time.perf_counter() if record else 0.0
        if self._adasum_within_host is not None:
            within = self._adasum_within_host
            within._reduce_scaled_in_place(window, ReduceOp.SUM, 1.0 / within.comm.Get_size())
        adasum.allreduce(self._adasum_comm, self._adasum_comms, window, sizes,
                         max(1, self.settings.chunk_bytes // window.itemsize))
        if postscale != 1.0:
            _scale(window, postscale)
        t2 = time.perf_counter() if record else 0.0
        offset = 0
        for destination in destinations if len(sources) > 1 else ():
            destination[...] = window[offset:offset + destination.size]
            offset += destination.size
        if record:
            everything = tuple(range(len(sources)))
            record("MEMCPY_IN_FUSION_BUFFER", t0, t1, everything)
            record("MPI_ADASUM_ALLREDUCE", t1, t2, everything)
            record("MEMCPY_OUT_FUSION_BUFFER", t2, time.perf_counter(), everything)

    def allgather(self, entry, first_dims):
        return self.gather_rows(entry.array, first_dims)

    def broadcast(self, entry, root):
        self.broadcast_bytes(entry.array, entry.output, root)

    def alltoall(self, entry):
        return self.exchange_rows(entry.array, entry.splits)

    def reducescatter(self, entry, op, prescale, postscale):
        return self.reduce_rows(entry.array, op, prescale, postscale)

    # The same on host arrays, for the host-staged GPU path too.

    def gather_rows(self, source, first_dims):
        MPI = self._MPI
        row_shape = source.shape[1:]
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * source.dtype.itemsize
        output = np.empty((sum(first_dims),) + row_shape, source.dtype)
        counts = [d * row_bytes for d in first_dims]
        displacements = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
        self.comm.Allgatherv([_byte_view(source), MPI.BYTE],
                             [_byte_view(output), counts, displacements, MPI.BYTE])
        return output

    def broadcast_bytes(self, source, destination, root):
        if self.comm.Get_rank() == root and source is not destination:
            destination[...] = source
        data = _byte_view(destination)
        chunk = self.settings.chunk_bytes
        for start in range(0, max(data.size, 1), chunk):
            self.comm.Bcast([data[start:start + chunk], self._MPI.BYTE], root=root)

    def exchange_rows(self, source, splits):
        MPI = self._MPI
        size = self.comm.Get_size()
        received_splits = np.empty(size, np.int64)
        self.comm.Alltoall([np.ascontiguousarray(splits, np.int64), MPI.INT64_T], [received_splits, MPI.INT64_T])
        row_shape = source.shape[1:]
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * source.dtype.itemsize
        output = np.empty((int(received_splits.sum()),) + row_shape, source.dtype)
        send_counts = (np.asarray(splits, np.int64) * row_bytes).tolist()
        receive_counts = (received_splits * row_bytes).tolist()
        send_displacements = np.concatenate(([0], np.cumsum(send_counts)[:-1])).tolist()
        receive_displacements = np.concatenate(([0], np.cumsum(receive_counts)[:-1])).tolist()
        self.comm.Alltoallv([_byte_view(source), send_counts, send_displacements, MPI.BYTE],
                            [_byte_view(output), receive_counts, receive_displacements, MPI.BYTE])
        return output, received_splits

    def reduce_rows(self, source, op, prescale, postscale):
        size, rank = self.comm.Get_size(), self.comm.Get_rank()
        if op == ReduceOp.AVERAGE:
            postscale /= size
        rows = reducescatter_rows(source.shape[0], size)
        row_elements = int(np.prod(source.shape[1:], dtype=np.int64))
        output = np.empty((rows[rank],) + source.shape[1:], source.dtype)
        if prescale != 1.0:
            scaled = np.empty_like(source)
            _scale(scaled, prescale, source)
            source = scaled
        send, mpi_op = self._operands(source.reshape(-1), op)
        receive, _ = self._operands(output.reshape(-1), op)
        self.comm.Reduce_scatter(send, receive, [r * row_elements for r in rows], mpi_op)
        if postscale != 1.0:
            _scale(output, postscale)
        return output


def reducescatter_rows(first_dim, size):
    """Rows of a reducescatter result on each rank: an even split, the first ranks taking
    one extra row when it does not divide."""
    base, extra = divmod(first_dim, size)
    return [base + (1 if r < extra else 0) for r in range(size)]
