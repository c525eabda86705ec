"""What a submitting thread does before the engine sees a collective: name it, check it, and
describe it as a Request. Everything here runs on the caller's thread, for every tensor of every
step, so it is written for speed; whatever can never work is refused here, on the spot, before
any rank waits for it."""

import itertools
import math
import threading
import weakref

import numpy as np

from . import cuda
from .adasum import ADASUM_DTYPES, is_power_of_two
from .mpi_backend import REDUCIBLE_DTYPES
from .nccl_backend import NCCL_TYPES
from .negotiation import AUTO_NAME_MARK
from .requests import ALLREDUCE, BROADCAST, REDUCING_KINDS, Entry, Handle, Kind, ReduceOp, Request

REMEMBERED_REQUESTS = 4096
# What a collective that can never work raises when submitted.
REFUSALS = (ValueError, TypeError, NotImplementedError)


class Submissions:
    """Turns one rank's submissions into entries for the engine of a set of ranks: `size` ranks,
    the job's ranks `members`, `is_world` when they are the whole job, on hosts as `topology`
    (discovery.Topology) says."""

    def __init__(self, size, members, settings, is_world, topology, hurry=None):
        self.size = size
        self._topology = topology  # discovery.Topology of these ranks
        self.members = members
        self._hurry = hurry  # Engine.hurry, which each handle calls when a caller blocks on it
        self._gpu_operations = settings.gpu_operations
        self._is_world = is_world
        self._device = None  # the CUDA device of this rank's device buffers, once it submitted one
        self._position = {job_rank: rank for rank, job_rank in enumerate(members)}
        self._unnamed = {kind: itertools.count(1) for kind in Kind}
        self._naming = threading.Lock()
        self._buckets = {}  # bucket name -> (flat array, its address), checked once
        self._validated = {}  # name -> what its request was validated for (see _recall)

    def auto_name(self, kind):
        # Every rank numbers its unnamed collectives of a kind alike. A refused one takes its
        # number too: the refusal is announced under it (Engine.submit).
        with self._naming:
            return f"{kind.value}{AUTO_NAME_MARK}{next(self._unnamed[kind])}"

    def prepare(self, kind, array, name, output, op=ReduceOp.SUM, prescale=1.0, postscale=1.0, root=0,
                splits=None, bucket=None, stream=None, allocate=None):
        """The Entry of one collective; raises one of REFUSALS if it can never work."""
        request = self._recall(kind, name, array, output, op, prescale, postscale, root, bucket)
        if request is None:
            if array is not None and not isinstance(array, np.ndarray) and cuda.is_device_array(array):
                array, output, bucket = self._device_arrays(kind, name, array, output, bucket)
            request = self._validate(kind, name, array, output, op, prescale, postscale, root, splits, bucket)
            self._remember(request, array, output, splits, bucket)
        if output is None and (kind is ALLREDUCE or kind is BROADCAST):
            output = array
        entry = Entry(request, Handle(name, self._hurry), array, output,
                      None if splits is None else np.asarray(splits, np.int64), None if bucket is None else bucket[1])
        if request.device == "cuda":
            # Recorded now, on the stream that wrote the buffer: the engine's stream waits for it.
            device = array.device.id
            entry.stream = cuda.current_stream(device) if stream is None else stream
            entry.ready = cuda.record_ready(device, entry.stream)
            entry.allocate = allocate
        return entry

    def device_for(self, topology):
        """The CUDA device of this rank's device backends: that of its device buffers, or, for a
        rank that has submitted none (one that joined), the one its local rank would use."""
        if self._device is None:
            return topology.local_rank % cuda.cupy().cuda.runtime.getDeviceCount()
        return self._device

    def _device_arrays(self, kind, name, array, output, bucket):
        """Device buffers as CuPy arrays over the same memory, all on this rank's one device."""
        cp = cuda.cupy()
        label = f"{kind.value} '{name}'"

        def as_cupy(value):
            return value if value is None or isinstance(value, cp.ndarray) else cp.asarray(value)

        array = as_cupy(array)
        output = array if output is not None and output is array else as_cupy(output)
        if bucket is not None:
            bucket = (bucket[0], as_cupy(bucket[1]))
        if output is not None and output.device.id != array.device.id:
            raise ValueError(f"{label}: the tensor is on cuda:{array.device.id} but its output on cuda:{output.device.id}")
        if self._device is None:
            self._device = array.device.id
        elif array.device.id != self._device:
            raise ValueError(f"{label}: the tensor is on cuda:{array.device.id}, but this rank's collectives run on "
                             f"cuda:{self._device} (one GPU per rank: move the tensor there)")
        return array, output, bucket

    # Training submits every gradient under the same name, from the same array object, every
    # step, and validating it costs more than the rest of a submission (measured: 10 us of a
    # 12 us allreduce_async). So an in-place allreduce or broadcast remembers what its request
    # was validated for; the request stands while the array object, its layout, the bucket
    # object and the options are unchanged. Weak references: remembering keeps nothing alive.

    def _remember(self, request, array, output, splits, bucket):
        if (request.kind not in (ALLREDUCE, BROADCAST) or (output is not None and output is not array)
                or splits is not None or AUTO_NAME_MARK in request.name):
            return
        if len(self._validated) >= REMEMBERED_REQUESTS:
            self._validated.clear()
        options = (request.kind, request.op, request.prescale, request.postscale, request.root, request.bucket,
                   array.shape, array.dtype)
        bucket_ref = None if bucket is None else weakref.ref(bucket[1])
        self._validated[request.name] = (weakref.ref(array), bucket_ref, options, request)

    def _recall(self, kind, name, array, output, op, prescale, postscale, root, bucket):
        known = self._validated.get(name)
        if known is None or (output is not None and output is not array):
            return None
        array_ref, bucket_ref, options, request = known
        if array_ref() is not array or (bucket is None) is not (bucket_ref is None):
            return None
        if bucket is None:
            bucket_name = ""
        elif bucket_ref() is bucket[1]:
            bucket_name = bucket[0]
        else:
            return None
        if options != (kind, op, prescale, postscale, root, bucket_name, array.shape, array.dtype):
            return None
        flags = array.flags
        if request.device == "cuda":
            return request if flags.c_contiguous else None
        return request if flags.c_contiguous and flags.writeable else None

    def _validate(self, kind, name, array, output, op, prescale, postscale, root, splits, bucket):
        """The request of a collective that can work, or the error that says why it cannot."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"collective name must be a non-empty string, got {name!r}")
        label = f"{kind.value} '{name}'"
        if kind in (Kind.BARRIER, Kind.JOIN):
            return Request(name, kind)
        on_device = not isinstance(array, np.ndarray)
        if on_device and not cuda.is_device_array(array):
            raise TypeError(f"{label}: expected a NumPy array or a CUDA array (CuPy), got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{label}: the tensor must be contiguous")
        if output is not None and isinstance(output, np.ndarray) == on_device:
            kind_of_array = "CUDA (CuPy)" if on_device else "NumPy"
            raise TypeError(f"{label}: output must be a {kind_of_array} array like the tensor, got {type(output).__name__}")
        if output is not None and output is not array and (
            not output.flags.c_contiguous or output.shape != array.shape or output.dtype != array.dtype
        ):
            raise ValueError(
                f"{label}: output must be a contiguous array of shape {array.shape} and dtype "
                f"{array.dtype}, got shape {output.shape} and dtype {output.dtype}"
            )
        # The engine thread writes the result there; failing only then would stop the whole job.
        written = output if output is not None else array if kind in (Kind.ALLREDUCE, Kind.BROADCAST) else None
        if written is not None and not on_device and not written.flags.writeable:
            raise ValueError(f"{label}: the array the result goes into is read-only")
        dtype = dtype_name(label, array.dtype)
        if op.__class__ is not ReduceOp:
            op = ReduceOp(op)
        if kind in REDUCING_KINDS:
            if op == ReduceOp.ADASUM:
                self._check_adasum(label, kind, dtype, on_device)
            if dtype not in REDUCIBLE_DTYPES:
                raise TypeError(
                    f"{label}: cannot reduce dtype {dtype}; reducible dtypes are {sorted(REDUCIBLE_DTYPES)}"
                )
            if on_device and self._gpu_operations[kind.value] == "NCCL" and dtype not in NCCL_TYPES:
                variable = f"HOROVOD_GPU_{kind.value.upper()}"
                raise TypeError(f"{label}: NCCL cannot reduce dtype {dtype} (it reduces {', '.join(NCCL_TYPES)}); "
                                f"set {variable}=MPI to reduce it through host memory, or cast it")
            if not (math.isfinite(prescale) and math.isfinite(postscale)):
                raise ValueError(
                    f"{label}: prescale_factor and postscale_factor must be finite, got {prescale} and {postscale}"
                )
        if kind == Kind.BROADCAST and root not in self._position:
            where = f"this job (size {self.size})" if self._is_world else f"process set {list(self.members)}"
            raise ValueError(f"{label}: root_rank {root} is not a rank of {where}")
        if kind in (Kind.ALLGATHER, Kind.ALLTOALL, Kind.REDUCESCATTER) and array.ndim == 0:
            raise ValueError(f"{label}: the tensor needs at least one dimension")
        if kind == Kind.ALLTOALL:
            self._check_splits(label, splits, array.shape[0])
        bucket_name, offset = "", -1
        if bucket is not None:
            bucket_name, offset = bucket[0], self._offset_in_bucket(label, array, output, *bucket)
        return Request(name, kind, dtype, array.shape, op, float(prescale), float(postscale), int(root),
                       "cuda" if on_device else "cpu", bucket_name, offset)

    def adasum_refusal(self, on_device):
        """Why Adasum cannot combine these ranks' host (or device) buffers, in one line; None
        where it can."""
        if on_device and self._gpu_operations["allreduce"] == "NCCL":  # across hosts (Engine._backend)
            hosts = self._topology.cross_size
            if not (self._topology.is_homogeneous and is_power_of_two(hosts)):
                return (f"Adasum of GPU tensors averages within each host and combines across hosts, so it "
                        f"needs as many ranks on every host and a power of two of hosts; this job has {hosts} hosts"
                        f"{'' if self._topology.is_homogeneous else ' with different numbers of ranks'} (with "
                        "HOROVOD_GPU_ALLREDUCE=MPI it combines over all ranks, a power of two of them)")
        elif not is_power_of_two(self.size):
            where = "this job has" if self._is_world else f"process set {list(self.members)} has"
            return f"Adasum needs a power of two of ranks; {where} {self.size}"
        return None

    def _check_adasum(self, label, kind, dtype, on_device):
        # NotImplementedError is a RuntimeError, which Horovod's callers catch for every Adasum refusal
        if kind is not ALLREDUCE:
            raise NotImplementedError(f"{label}: op Adasum is an allreduce only")
        refusal = self.adasum_refusal(on_device)
        if refusal is not None:
            raise NotImplementedError(f"{label}: {refusal}")
        if dtype not in ADASUM_DTYPES:
            raise TypeError(f"{label}: Adasum combines {', '.join(ADASUM_DTYPES)} tensors, not {dtype}")

    def _check_splits(self, label, splits, first_dim):
        if splits is None:
            raise ValueError(
                f"{label}: without splits the first dimension ({first_dim}) must be divisible by the number of "
                f"ranks ({self.size})"
            )
        given = np.asarray(splits)
        # Row counts: a float such as 1.5 would be truncated on this rank alone.
        if given.dtype.kind not in "iu" and given.size:
            raise ValueError(f"{label}: splits must be integers (row counts), got {_listed(splits)}")
        counts = given.astype(np.int64)
        if counts.shape != (self.size,) or (counts < 0).any() or counts.sum() != first_dim:
            raise ValueError(
                f"{label}: splits must be {self.size} non-negative row counts summing to the first dimension "
                f"{first_dim}, got {counts.tolist()}"
            )

    def _offset_in_bucket(self, label, array, output, bucket_name, bucket):
        """The element offset of `array` in the flat array `bucket`, checking it lies inside.
        The bucket itself is checked once per array object: this runs for every gradient."""
        if output is not None and output is not array:
            raise ValueError(f"{label}: a tensor in a bucket must be reduced in place")
        known = self._buckets.get(bucket_name)
        if known is None or known[0] is not bucket:
            if bucket.ndim != 1 or not bucket.flags.c_contiguous:
                raise ValueError(f"{label}: bucket '{bucket_name}' must be a flat contiguous array")
            known = self._buckets[bucket_name] = (bucket, _address(bucket))
        if bucket.dtype != array.dtype:
            raise ValueError(f"{label}: bucket '{bucket_name}' holds {bucket.dtype}, not {array.dtype}")
        offset, misaligned = divmod(_address(array) - known[1], array.itemsize)
        if misaligned or offset < 0 or offset + array.size > bucket.size:
            raise ValueError(f"{label}: the tensor does not lie inside bucket '{bucket_name}'")
        return offset


def _listed(values):
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


_DTYPE_NAMES = {}


def dtype_name(label, dtype):
    """`dtype.name`, which NumPy builds anew on every call (microseconds: it counts here)."""
    found = _DTYPE_NAMES.get(dtype)
    if found is None:
        if dtype.hasobject:
            raise TypeError(f"{label}: cannot send dtype {dtype}, which holds Python object references")
        found = _DTYPE_NAMES[dtype] = dtype.name
    return found


def _address(array):
    if isinstance(array, np.ndarray):
        return array.__array_interface__["data"][0]
    return array.data.ptr
