"""What ranks tell each other about a collective, and the handle a caller waits on.

Requests and responses are NamedTuples: they are built for every tensor of every step and
compared on every cycle, and tuples do both in C.
"""

import enum
import functools
import math
import threading
import time
from typing import NamedTuple, Optional, Tuple

import numpy as np


class ReduceOp(enum.IntEnum):
    # Horovod's numbering, so that values passed through from Horovod scripts keep their meaning.
    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


class Kind(str, enum.Enum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"


# Looking up an enum member costs about 0.2 us on Python 3.11, and the submission path and
# the engine's intake did it several times per tensor: hot paths use these names instead.
ALLREDUCE, BROADCAST, JOIN = Kind.ALLREDUCE, Kind.BROADCAST, Kind.JOIN

# Kinds whose first dimension may differ between ranks.
RAGGED_KINDS = (Kind.ALLGATHER, Kind.ALLTOALL)
REDUCING_KINDS = (Kind.ALLREDUCE, Kind.REDUCESCATTER)


class Request(NamedTuple):
    """One rank's description of a collective; every rank must send a compatible one."""

    name: str
    kind: Kind
    dtype: str = ""
    shape: Tuple[int, ...] = ()
    op: ReduceOp = ReduceOp.SUM
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = 0
    device: str = "cpu"
    # Where the tensor lies in a bucket, a flat array shared by several tensors (such as the
    # gradients of a model): the bucket's name and the tensor's element offset in it. Tensors
    # of one bucket that lie next to each other are reduced as one region, without copies.
    bucket: str = ""
    offset: int = -1
    # Why this rank refused the collective when it was submitted (the caller got that error at
    # once); the coordinator then fails it on the ranks that did submit it, which would
    # otherwise wait for this rank forever.
    refusal: str = ""

    @property
    def nbytes(self):
        return math.prod(self.shape) * itemsize(self.dtype)


class Response(NamedTuple):
    """The coordinator's verdict on one name, identical on every rank."""

    name: str
    kind: Kind
    request: Optional[Request] = None  # the agreed description (from the lowest submitting rank)
    error: Optional[str] = None
    error_field: Optional[str] = None
    error_values: Optional[dict] = None
    first_dims: Optional[Tuple[int, ...]] = None  # allgather: rows contributed by each rank
    last_joined_rank: int = -1


@functools.lru_cache(maxsize=None)
def itemsize(dtype_name):
    return numpy_dtype(dtype_name).itemsize


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class Handle:
    """The future of one collective: `poll()` says whether it finished, `wait()` returns its
    result or raises its error. On a device, finished means enqueued on the engine's stream:
    `done` is then the CUDA event that marks its completion, which wait() makes the caller's
    stream wait for."""

    __slots__ = ("name", "_done", "_result", "_error", "_waiter", "done", "_hurry")

    def __init__(self, name, hurry=None):
        # No lock yet: one is made only when a caller blocks. Training submits hundreds of
        # handles a step and finds most of them finished by the time it waits.
        self.name = name
        self._hurry = hurry  # called with this handle when a caller blocks on it (Engine.hurry)
        self._done = False
        self._result = None
        self._error = None
        self._waiter = None
        self.done = None

    def poll(self):
        return self._done

    def wait(self, stream=None):
        """The result, once the collective has finished; for a device result, after making
        `stream` wait for it: a cudaStream_t as an int, or a function of the device id that
        gives one (default: CuPy's current stream)."""
        if not self._done:
            if self._hurry is not None:
                self._hurry(self)
            with _WAITER_CREATION:
                waiter = self._waiter
                if waiter is None:
                    # Held before _finish can see it: released while free, it would raise.
                    waiter = threading.Lock()
                    waiter.acquire()
                    self._waiter = waiter
            # _finish sets _done before it reads _waiter: either it sees this lock and releases
            # it, or _done is already true here.
            if not self._done:
                waiter.acquire()
                waiter.release()  # for any other thread waiting on the same handle
        if self._error is not None:
            raise self._error
        if self.done is not None:
            from . import cuda

            device = self.done.device
            if stream is None:
                stream = cuda.current_stream(device)
            self.done.wait_on(stream(device) if callable(stream) else stream)
        return self._result

    synchronize = wait

    def _finish(self, result=None, error=None, done=None):
        self._result = result
        self._error = error
        self.done = done
        self._done = True
        waiter = self._waiter
        if waiter is not None:
            waiter.release()


_WAITER_CREATION = threading.Lock()


class Entry:
    """A collective submitted on this rank and not yet finished."""

    __slots__ = ("request", "handle", "array", "output", "splits", "bucket", "submitted_at", "sent_to_coordinator",
                 "stream", "ready", "allocate")

    def __init__(self, request, handle, array=None, output=None, splits=None, bucket=None, stream=None, ready=None,
                 allocate=None):
        self.request = request
        self.handle = handle
        self.array = array  # input (C-contiguous)
        self.output = output  # where the result goes; the engine allocates it if None
        self.splits = splits  # alltoall: rows sent to each rank
        self.bucket = bucket  # the flat array named by request.bucket, if any
        self.submitted_at = time.perf_counter()
        self.sent_to_coordinator = False
        # Device buffers only: the caller's CUDA stream, the event recorded on it at submission
        # (the engine's stream waits for it), and how to allocate an output (default: CuPy).
        self.stream = stream
        self.ready = ready
        self.allocate = allocate

    @property
    def name(self):
        return self.request.name

    def age(self):
        return time.perf_counter() - self.submitted_at
