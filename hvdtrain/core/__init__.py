"""hvdtrain's communication core: framework-agnostic collectives on NumPy buffers.

    from hvdtrain import core
    core.init()                                   # under mpirun, or alone as a job of size 1
    handle = core.allreduce_async(array, name="grad.w", op=core.ReduceOp.AVERAGE)
    averaged = handle.wait()

Every collective is named, asynchronous and returns a Handle (`poll()`, `wait()`); one
background thread negotiates and runs them (engine.py). The framework adapters
(hvdtrain.torch, hvdtrain.tensorflow, hvdtrain.keras) turn their tensors into arrays and
call these functions; this package imports neither framework.
"""

import atexit
import logging
import os
import threading

import numpy as np

from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError
from .requests import ALLREDUCE, Handle, Kind, ReduceOp
from .settings import Settings, from_environment

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "topology", "mpi_threads_supported", "allreduce_async",
    "grouped_allreduce_async", "allgather_async", "broadcast_async", "alltoall_async",
    "reducescatter_async", "barrier", "join", "broadcast_object", "allgather_object", "start_timeline",
    "stop_timeline", "ReduceOp", "Handle", "HorovodInternalError", "TensorMismatchError",
    "HostsUpdatedInterrupt", "Settings",
]

_engine = None
_init_lock = threading.Lock()
_atexit_registered = False
_unnamed_object_calls = {}  # per kind, since this engine started: names the n-th unnamed call


def init(comm=None):
    """Start the engine on `comm` (an mpi4py communicator; MPI.COMM_WORLD by default).
    Calling it again while initialized does nothing."""
    global _engine, _atexit_registered
    with _init_lock:
        if _engine is not None and _engine.alive:
            return
        settings = from_environment()
        _configure_logging(settings.log_level)
        # The engine thread shares cores with the training threads: Open MPI must not spin while
        # it waits (see hvdtrain/launcher.py). Read when MPI starts, so only if it has not yet.
        os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        from mpi4py import MPI  # initializes MPI (thread level "multiple") on first import

        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise HorovodInternalError(
                "MPI was initialized without thread support; hvdtrain's engine thread needs at least "
                "MPI_THREAD_SERIALIZED (set mpi4py.rc.thread_level = 'multiple' before importing mpi4py.MPI)"
            )
        from .engine import Engine

        _engine = Engine(MPI.COMM_WORLD if comm is None else comm, settings)
        _unnamed_object_calls.clear()
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def _configure_logging(level):
    logger = logging.getLogger("hvdtrain.core")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[hvdtrain %(levelname)s] %(message)s"))
        logger.addHandler(handler)


def shutdown():
    global _engine
    with _init_lock:
        engine, _engine = _engine, None
    if engine is not None:
        engine.shutdown()


def is_initialized():
    return _engine is not None and _engine.alive


def running_engine():
    if _engine is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _engine


def topology():
    return running_engine().topology


def size():
    return running_engine().topology.size


def rank():
    return running_engine().topology.rank


def local_size():
    return running_engine().topology.local_size


def local_rank():
    return running_engine().topology.local_rank


def cross_size():
    return running_engine().topology.cross_size


def cross_rank():
    return running_engine().topology.cross_rank


def is_homogeneous():
    return running_engine().topology.is_homogeneous


def mpi_threads_supported():
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


# ------------------------------------------------------------------------- collectives


def allreduce_async(array, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0,
                    output=None, bucket=None) -> Handle:
    """Reduce `array` across ranks into `output` (default: into `array` itself).

    `bucket=(bucket_name, flat_array)` says that `array` is a view of `flat_array`, which holds
    other tensors too (a model's gradients, say) laid out alike on every rank; tensors that lie
    next to each other in a bucket are reduced as one region, without copies."""
    return running_engine().submit(ALLREDUCE, array, name=name, output=output, op=op,
                                   prescale=prescale_factor, postscale=postscale_factor, bucket=bucket)


def grouped_allreduce_async(arrays, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0,
                            postscale_factor=1.0, outputs=None):
    """Reduce a list of arrays as one group: negotiated together and fused where possible."""
    return running_engine().submit_group(Kind.ALLREDUCE, arrays, name=name, outputs=outputs, op=op,
                                 prescale=prescale_factor, postscale=postscale_factor)


def allgather_async(array, name=None) -> Handle:
    """Concatenate every rank's `array` along the first dimension, which may differ per rank."""
    return running_engine().submit(Kind.ALLGATHER, array, name=name)


def broadcast_async(array, root_rank, name=None, output=None) -> Handle:
    """Copy `root_rank`'s `array` into `output` (default: `array` itself) on every rank."""
    return running_engine().submit(Kind.BROADCAST, array, name=name, output=output, root=root_rank)


def alltoall_async(array, splits=None, name=None) -> Handle:
    """Send `splits[i]` rows of `array` to rank i, in order; the handle gives
    (received rows, received splits). Without splits, rows are divided evenly."""
    n = size()
    if splits is None:
        if array.ndim == 0 or array.shape[0] % n:
            raise ValueError(
                f"alltoall: without splits the first dimension ({array.shape[0] if array.ndim else 'scalar'}) "
                f"must be divisible by the number of ranks ({n})"
            )
        splits = [array.shape[0] // n] * n
    return running_engine().submit(Kind.ALLTOALL, array, name=name, splits=splits)


def reducescatter_async(array, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0,
                        postscale_factor=1.0) -> Handle:
    """Reduce `array` across ranks and give each rank its share of the first dimension
    (the first `dim % size` ranks get one extra row)."""
    if ReduceOp(op) not in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        raise ValueError(f"reducescatter: unsupported op {op!r}")
    return running_engine().submit(Kind.REDUCESCATTER, array, name=name, op=op, prescale=prescale_factor,
                           postscale=postscale_factor)


def barrier():
    """Return once every rank has called barrier()."""
    running_engine().submit(Kind.BARRIER).wait()


def join():
    """Declare that this rank has no more data. Until every rank has joined, the others'
    allreduces go on with this rank contributing zeros. Returns the last rank to join."""
    return running_engine().submit(Kind.JOIN, name="join").wait()


def synchronize(handle):
    return handle.wait()


def poll(handle):
    return handle.poll()


def start_timeline(file_path, mark_cycles=False):
    running_engine().start_timeline(file_path, mark_cycles)


def stop_timeline():
    running_engine().stop_timeline()


# ------------------------------------------------------------------------- Python objects


def _dumps(obj):
    import cloudpickle

    return np.frombuffer(cloudpickle.dumps(obj), np.uint8).copy()  # writable: MPI sends from it


def _next_object_name(kind):
    count = _unnamed_object_calls.get(kind, 0)
    _unnamed_object_calls[kind] = count + 1
    return f"{kind}.{count}"


def _loads(payload):
    import cloudpickle

    return cloudpickle.loads(payload.tobytes())


def broadcast_object(obj, root_rank=0, name=None):
    """Pickle `obj` on `root_rank` and return a copy of it on every rank. Without a `name`, the
    n-th unnamed call is matched with the n-th on every rank: the name cannot come from `obj`,
    which non-root ranks often pass as None."""
    name = _next_object_name("broadcast_object") if name is None else name
    is_root = rank() == root_rank
    payload = _dumps(obj) if is_root else None
    length = np.array([payload.size if is_root else 0], np.int64)
    broadcast_async(length, root_rank, name=f"{name}.sz").wait()
    if not is_root:
        payload = np.empty(int(length[0]), np.uint8)
    broadcast_async(payload, root_rank, name=f"{name}.t").wait()
    return obj if is_root else _loads(payload)


def allgather_object(obj, name=None):
    """Return the list of every rank's `obj`, in rank order (unnamed calls match as in broadcast_object)."""
    name = _next_object_name("allgather_object") if name is None else name
    payload = _dumps(obj)
    lengths = allgather_async(np.array([payload.size], np.int64), name=f"{name}.sz").wait()
    gathered = allgather_async(payload, name=f"{name}.t").wait()
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    return [_loads(gathered[bounds[i]:bounds[i + 1]]) for i in range(len(lengths))]
