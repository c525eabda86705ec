"""Collectives on CuPy buffers in device memory, through NCCL (CuPy's bindings), on a CUDA
stream of the engine's own.

One communicator per engine, that is per process set, made at the set's first GPU collective
(every rank reaches it at the same step of the same plan): the ranks first agree over MPI that
each of them can take part (CuPy and NCCL load, one GPU per rank), then rank 0 makes NCCL's
unique id and broadcasts it over MPI.

Nothing here blocks the host on the GPU. Each step's work is enqueued on the engine's stream
after the events of the callers' submissions (start), and ends with an event that the callers'
streams wait on (finish); the buffers a step uses are kept alive until that event completes.
"""

import collections
import math
import os
import time

import numpy as np

from . import cuda
from .exceptions import HorovodInternalError
from .fusion import Pack, plan_allreduce
from .mpi_backend import reducescatter_rows
from .requests import ReduceOp

# NCCL's ncclDataType_t and ncclRedOp_t (nccl.h); NCCL reduces no 16-bit integers.
NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
              "float32": 7, "float64": 8, "bfloat16": 9}
NCCL_BYTES = NCCL_TYPES["uint8"]
NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3}
NCCL_AVG = 4  # NCCL >= 2.10: the sum divided by the number of ranks, in the reduction itself

UNSPLIT = 1 << 62  # NCCL pipelines large buffers itself: a tensor is one call, however large

# One launch copies many (destination, source, bytes) rows: the fusion buffer's packing and
# unpacking, which would otherwise cost a launch per tensor. Rows aligned to 16 bytes move
# 16 bytes per thread.
BATCHED_COPY_SOURCE = r"""
extern "C" __global__ void hvdtrain_batched_copy(const unsigned long long* rows, int count) {
  for (int c = blockIdx.x; c < count; c += gridDim.x) {
    const unsigned long long destination = rows[3 * c], source = rows[3 * c + 1], bytes = rows[3 * c + 2];
    if (((destination | source | bytes) & 15ULL) == 0) {
      uint4* d = reinterpret_cast<uint4*>(destination);
      const uint4* s = reinterpret_cast<const uint4*>(source);
      for (unsigned long long i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
    } else {
      char* d = reinterpret_cast<char*>(destination);
      const char* s = reinterpret_cast<const char*>(source);
      for (unsigned long long i = threadIdx.x; i < bytes; i += blockDim.x) d[i] = s[i];
    }
  }
}
"""
COPY_BLOCKS, COPY_THREADS = 1024, 256


def scale_on_device(cp, destination, factor, source=None):
    """`destination` = `source` (default: itself) times `factor`, as the host path scales
    (mpi_backend._scale): 16-bit floats in float32, integers in float64 truncated toward zero,
    float32 and float64 in their own precision."""
    source = destination if source is None else source
    kind, itemsize = destination.dtype.kind, destination.dtype.itemsize
    if kind in "fV" and itemsize == 2:
        cp.multiply(source, np.float32(factor), out=destination, dtype=np.float32, casting="unsafe")
    elif kind == "f":
        cp.multiply(source, destination.dtype.type(factor), out=destination)
    else:
        cp.multiply(source, np.float64(factor), out=destination, dtype=np.float64, casting="unsafe")


def duplicate_devices(placements):
    """Ranks that share a GPU: `placements[r]` is rank r's (host, device id); returns lists of
    ranks on one device, or [] (NCCL refuses a device twice in one communicator)."""
    by_device = collections.defaultdict(list)
    for rank, placement in enumerate(placements):
        by_device[tuple(placement)].append(rank)
    return [ranks for ranks in by_device.values() if len(ranks) > 1]


def agree_to_start(comm, prepare, what):
    """Run `prepare()` on every rank of `comm` and agree over MPI whether all succeeded, so that
    a rank that cannot take part fails the collective on every rank instead of leaving the
    others in a collective it never joins. Returns every rank's result of prepare()."""
    try:
        outcome = (True, prepare())
    except Exception as error:  # reported on every rank below
        outcome = (False, str(error) or type(error).__name__)
    outcomes = comm.allgather(outcome)
    failed = [(rank, message) for rank, (ok, message) in enumerate(outcomes) if not ok]
    if failed:
        ranks = ", ".join(str(rank) for rank, _ in failed)
        raise HorovodInternalError(f"{what} cannot start: rank {ranks}: {failed[0][1]}")
    return [result for _, result in outcomes]


def start_on_devices(comm, device_of, what, needs_nccl):
    """Agree over MPI that every rank can use its GPU (CuPy loads; NCCL too where `needs_nccl`),
    at the first collective of a device backend; `device_of()` gives this rank's device. Returns
    it and every rank's (host, PCI bus id of its GPU)."""

    def prepare():
        if needs_nccl:
            cuda.nccl()
        device = device_of()
        return device, (nccl_host(), _pci_bus_id(device))

    results = agree_to_start(comm, prepare, what)
    return results[comm.Get_rank()][0], [placement for _, placement in results]


def exchange_unique_id(comm, nccl):
    """NCCL's unique id of a new communicator: made by rank 0, broadcast over MPI."""
    return comm.bcast(nccl.get_unique_id() if comm.Get_rank() == 0 else None, root=0)


def allreduce_steps(sizes, itemsize, settings):
    """The fusion plan of a batch on NCCL: each tensor of at least `pack_below_bytes` reduced
    where it lies, in one call however large (NCCL pipelines it); smaller ones packed into the
    fusion buffer, up to HOROVOD_FUSION_THRESHOLD per pack (0: no packing)."""
    return plan_allreduce(tuple(sizes), itemsize, UNSPLIT, settings.pack_below_bytes,
                          settings.fusion_threshold_bytes)


class _DeviceStream:
    """What both device backends share: the device, the engine's stream on it, the callers'
    ready events, the done events and the buffers kept alive until their work completes."""

    def __init__(self, device):
        cp = cuda.cupy()
        self.cp = cp
        self.device = device
        with cp.cuda.Device(device):
            self.stream = cp.cuda.Stream(non_blocking=True)
        self._in_flight = collections.deque()  # (done event, buffers) in stream order
        self._step_buffers = []

    def enter(self):
        """Make this device and stream current for CuPy on the engine thread."""
        self.cp.cuda.runtime.setDevice(self.device)
        self.stream.use()

    def start(self, entries):
        self.enter()
        runtime, stream, seen = self.cp.cuda.runtime, self.stream.ptr, set()
        for entry in entries:
            event = entry.ready
            if event is not None and event not in seen:  # waited for, and given back, once
                seen.add(event)
                runtime.streamWaitEvent(stream, event)
                cuda.events.give_back(self.device, event)
            entry.ready = None

    def finish(self, entries):
        done = cuda.DoneEvent(self.device, self.stream.ptr)
        self._in_flight.append((done, (entries, self._step_buffers)))
        self._step_buffers = []
        self.pending()
        return done

    def keep(self, buffer):
        """Keep a temporary of this step alive until its work is done."""
        self._step_buffers.append(buffer)
        return buffer

    def allocate(self, entry, shape, dtype):
        """The output of `entry`: from the caller's allocator (default: CuPy's pool, on the
        caller's stream, so that the pool orders reuse of that memory on the stream that reads
        it), and ordered after everything the caller's stream had enqueued when it was made (the
        memory may have been in use there)."""
        if entry.allocate is not None:
            output = entry.allocate(shape, dtype)
        else:
            with self.cp.cuda.Stream.from_external(_ExternalStream(entry.stream)):
                output = self.cp.empty(shape, dtype)
        event = cuda.record_ready(self.device, entry.stream)
        self.cp.cuda.runtime.streamWaitEvent(self.stream.ptr, event)
        cuda.events.give_back(self.device, event)
        return output

    def zeros(self, elements, dtype):
        self.enter()
        return self.keep(self.cp.zeros(elements, dtype))

    def pending(self):
        """Whether work handed to the device has not completed; lets go of what has."""
        while self._in_flight and self._in_flight[0][0].done:
            self._in_flight.popleft()
        return bool(self._in_flight)

    def check(self):
        pass

    def close(self):
        self._in_flight.clear()


class NcclBackend(_DeviceStream):
    transport = "NCCL"

    def __init__(self, comm, settings, device_of):
        self.comm = comm
        self.settings = settings
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        device, placements = start_on_devices(comm, device_of, "NCCL", needs_nccl=True)
        nccl = cuda.nccl()
        shared = duplicate_devices(placements)
        if shared:
            groups = "; ".join(f"ranks {', '.join(map(str, ranks))} on {placements[ranks[0]][0]} "
                               f"GPU {placements[ranks[0]][1]}" for ranks in shared)
            raise HorovodInternalError(
                f"NCCL needs one GPU per rank, but {groups} share one; give each local rank its own GPU "
                "(torch.cuda.set_device(hvd.local_rank())) or set HOROVOD_GPU_OPERATIONS=MPI to reduce "
                "GPU buffers through host memory")
        super().__init__(device)
        unique_id = exchange_unique_id(comm, nccl)
        with self.cp.cuda.Device(device):
            self._nccl = nccl.NcclCommunicator(self.size, unique_id, self.rank)
        self._fusion = self.cp.empty(0, np.uint8)
        self._copy_kernel = None
        self._copy_tables = {}

    # ------------------------------------------------------------------ allreduce

    def allreduce(self, sources, destinations, op, prescale, postscale, record=None):
        self.enter()
        cp, stream = self.cp, self.stream.ptr
        dtype = destinations[0].dtype
        nccl_type = NCCL_TYPES[_dtype_name(dtype)]
        nccl_op, postscale = self._nccl_op(op, dtype, postscale)
        plan = allreduce_steps([d.size for d in destinations], dtype.itemsize, self.settings)
        # Every pack of the batch gets its own window of the fusion buffer: they are all in
        # flight in one NCCL group.
        fusion = self._fusion_buffer(sum(step.elements for step in plan if isinstance(step, Pack)) * dtype.itemsize)
        window_at = 0
        calls = []  # (send pointer, receive pointer, elements) of the grouped NCCL calls
        windows = []  # (window, indices) of the packs, to scale and unpack afterwards
        started = time.perf_counter() if record else 0.0
        for step in plan:
            if isinstance(step, Pack):
                window = fusion[window_at:window_at + step.elements * dtype.itemsize].view(dtype)
                window_at += step.elements * dtype.itemsize
                self._copy_through_window(window, [sources[i] for i in step.indices], into_window=True)
                if prescale != 1.0:
                    scale_on_device(cp, window, prescale)
                calls.append((window.data.ptr, window.data.ptr, window.size))
                windows.append((window, step.indices))
                continue
            source, destination = sources[step.index], destinations[step.index]
            if prescale != 1.0:
                scale_on_device(cp, destination, prescale, source)
                source = destination
            calls.append((source.data.ptr, destination.data.ptr, destination.size))
        nccl = cuda.nccl()
        nccl.groupStart()
        try:
            for send, receive, elements in calls:
                self._nccl.allReduce(send, receive, elements, nccl_type, nccl_op, stream)
        finally:
            nccl.groupEnd()
        for window, indices in windows:
            if postscale != 1.0:
                scale_on_device(cp, window, postscale)
            self._copy_through_window(window, [destinations[i] for i in indices], into_window=False)
        if postscale != 1.0:
            packed = {i for _, indices in windows for i in indices}
            for i, destination in enumerate(destinations):
                if i not in packed:
                    scale_on_device(cp, destination, postscale)
        if record:  # host time to enqueue: the device's own time is in the CUDA profilers
            record("NCCL_ALLREDUCE", started, time.perf_counter(), tuple(range(len(destinations))))

    def _nccl_op(self, op, dtype, postscale):
        """NCCL's op for a request's op, and the postscale still to apply after it. Average of
        floats divides inside NCCL's reduction; of integers, as a sum scaled afterwards (as
        the host path does)."""
        if op == ReduceOp.AVERAGE:
            if dtype.kind in "fV":
                return NCCL_AVG, postscale
            return NCCL_OPS[ReduceOp.SUM], postscale / self.size
        return NCCL_OPS[op], postscale

    def _fusion_buffer(self, nbytes):
        """The persistent fusion buffer, at least `nbytes` long. A batch's packs hold at most
        HOROVOD_FUSION_THRESHOLD bytes (the engine closes a batch there), so it grows to that
        at most. Replacing it while enqueued work still reads the old one is safe: CuPy's pool
        reuses memory freed on this stream only for work enqueued on it later."""
        if self._fusion.nbytes < nbytes:
            self._fusion = self.cp.empty(nbytes, np.uint8)
        return self._fusion

    def _copy_through_window(self, window, arrays, into_window):
        """Copy whole `arrays` into consecutive parts of `window` (packing) or out of them
        (unpacking), all in one launch."""
        rows, at = [], window.data.ptr
        for array in arrays:
            ptr = array.data.ptr
            rows.append((at, ptr, array.nbytes) if into_window else (ptr, at, array.nbytes))
            at += array.nbytes
        key = tuple(rows)
        table = self._copy_tables.get(key)
        if table is None:
            if len(self._copy_tables) >= 256:
                self._copy_tables.clear()
            table = self._copy_tables[key] = self.cp.asarray(np.array(rows, np.uint64).reshape(-1))
        if self._copy_kernel is None:
            self._copy_kernel = self.cp.RawKernel(BATCHED_COPY_SOURCE, "hvdtrain_batched_copy")
        blocks = min(len(rows), COPY_BLOCKS)
        self._copy_kernel((blocks,), (COPY_THREADS,), (table, np.int32(len(rows))))

    # ------------------------------------------------------------------ the other collectives

    def allgather(self, entry, first_dims):
        self.enter()
        source = entry.array
        row_bytes = _row_bytes(source)
        output = self.allocate(entry, (sum(first_dims),) + source.shape[1:], source.dtype)
        stream = self.stream.ptr
        if len(set(first_dims)) == 1:
            self._nccl.allGather(source.data.ptr, output.data.ptr, first_dims[0] * row_bytes, NCCL_BYTES, stream)
            return output
        # Ragged rows: each rank broadcasts its part into its place, all in one group.
        nccl = cuda.nccl()
        offset = 0
        nccl.groupStart()
        try:
            for rank, rows in enumerate(first_dims):
                self._nccl.broadcast(source.data.ptr, output.data.ptr + offset, rows * row_bytes, NCCL_BYTES, rank,
                                     stream)
                offset += rows * row_bytes
        finally:
            nccl.groupEnd()
        return output

    def broadcast(self, entry, root):
        self.enter()
        self._nccl.broadcast(entry.array.data.ptr, entry.output.data.ptr, entry.array.nbytes, NCCL_BYTES, root,
                             self.stream.ptr)

    def alltoall(self, entry):
        self.enter()
        from mpi4py import MPI

        source, splits = entry.array, entry.splits
        received = np.empty(self.size, np.int64)  # the row counts travel on the host, over MPI
        self.comm.Alltoall([np.ascontiguousarray(splits, np.int64), MPI.INT64_T], [received, MPI.INT64_T])
        output = self.allocate(entry, (int(received.sum()),) + source.shape[1:], source.dtype)
        row_bytes = _row_bytes(source)
        sent_at = np.concatenate(([0], np.cumsum(splits)[:-1])) * row_bytes
        received_at = np.concatenate(([0], np.cumsum(received)[:-1])) * row_bytes
        nccl, stream = cuda.nccl(), self.stream.ptr
        nccl.groupStart()
        try:
            for peer in range(self.size):
                self._nccl.send(source.data.ptr + int(sent_at[peer]), int(splits[peer]) * row_bytes, NCCL_BYTES, peer,
                                stream)
                self._nccl.recv(output.data.ptr + int(received_at[peer]), int(received[peer]) * row_bytes, NCCL_BYTES,
                                peer, stream)
        finally:
            nccl.groupEnd()
        return output, received

    def reducescatter(self, entry, op, prescale, postscale):
        self.enter()
        cp, stream = self.cp, self.stream.ptr
        source = entry.array
        rows = reducescatter_rows(source.shape[0], self.size)
        row_elements = math.prod(source.shape[1:])
        output = self.allocate(entry, (rows[self.rank],) + source.shape[1:], source.dtype)
        if prescale != 1.0:
            scaled = self.keep(cp.empty_like(source))
            scale_on_device(cp, scaled, prescale, source)
            source = scaled
        nccl_type = NCCL_TYPES[_dtype_name(source.dtype)]
        nccl_op, postscale = self._nccl_op(op, source.dtype, postscale)
        if len(set(rows)) == 1:
            self._nccl.reduceScatter(source.data.ptr, output.data.ptr, output.size, nccl_type, nccl_op, stream)
        else:  # uneven rows: rank r is the root of a reduction of its own rows
            nccl, offset = cuda.nccl(), 0
            nccl.groupStart()
            try:
                for rank, count in enumerate(rows):
                    elements = count * row_elements
                    self._nccl.reduce(source.data.ptr + offset * source.itemsize, output.data.ptr, elements,
                                      nccl_type, nccl_op, rank, stream)
                    offset += elements
            finally:
                nccl.groupEnd()
        if postscale != 1.0:
            scale_on_device(cp, output, postscale)
        return output

    # ------------------------------------------------------------------ failures and the end

    def check(self):
        """Ask NCCL for an asynchronous error (a peer gone, a network failure) while work is in
        flight; on one, abort the communicator, which ends its kernels, and raise."""
        if not self.pending():  # the engine asks every DEVICE_CHECK_INTERVAL_S at most
            return
        try:
            self._nccl.check_async_error()
        except cuda.nccl().NcclError as error:
            self._nccl.abort()
            raise HorovodInternalError(f"NCCL failed on rank {self.rank}: {error}; the communicator was aborted")

    def close(self):
        if all(done.done for done, _ in self._in_flight):
            self._nccl.destroy()
        else:  # work that will never end (a peer gone): destroying would wait for it
            self._nccl.abort()
        self._in_flight.clear()


class _ExternalStream:
    """A cudaStream_t, as CuPy's Stream.from_external takes it (the CUDA stream protocol)."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return 0, self.ptr


def _dtype_name(dtype):
    return "bfloat16" if dtype.kind == "V" else dtype.name


def _row_bytes(array):
    return math.prod(array.shape[1:]) * array.itemsize


def nccl_host():
    """The host of this rank as NCCL tells hosts apart, which is what its duplicate-GPU rule
    compares: NCCL_HOSTID where it is set (ranks in containers of one machine, or ranks that share
    a GPU and that NCCL is to join over its network transport), else the host name."""
    import socket

    return os.environ.get("NCCL_HOSTID") or socket.gethostname()


def _pci_bus_id(device):
    return cuda.cupy().cuda.runtime.deviceGetPCIBusId(device)
