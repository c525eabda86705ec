"""hvdtrain's communication core: framework-agnostic collectives on NumPy buffers in host
memory and CuPy buffers in device memory.

    from hvdtrain import core
    core.init()                                   # under mpirun, or alone as a job of size 1
    handle = core.allreduce_async(array, name="grad.w", op=core.ReduceOp.AVERAGE)
    averaged = handle.wait()

Every collective is named, asynchronous and returns a Handle (`poll()`, `wait()`); one
background thread negotiates and runs them (engine.py). The framework adapters
(hvdtrain.torch, hvdtrain.tensorflow, hvdtrain.keras) turn their tensors into arrays and
call these functions; this package imports neither framework, and CuPy only when a device
buffer comes (cuda.py). A device collective takes `stream=`, the caller's CUDA stream
(default: CuPy's current one): it is ordered after what that stream had enqueued, and wait()
orders that stream after the collective, without blocking the host.
"""

import atexit
import logging
import threading

import numpy as np

from . import cuda as _cuda
from . import openmpi as _openmpi
from . import process_sets as _process_sets
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .requests import ALLREDUCE, Handle, Kind, ReduceOp
from .settings import Settings, from_environment, ignored_variables

# Open MPI reads its settings when MPI starts, which importing mpi4py.MPI does: a script that
# imports it after hvdtrain but before init() must start MPI with them too.
_openmpi.tune_environment()

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "topology", "mpi_threads_supported", "allreduce_async",
    "grouped_allreduce_async", "allgather_async", "grouped_allgather_async", "broadcast_async",
    "alltoall_async", "reducescatter_async", "grouped_reducescatter_async", "barrier", "barrier_async", "join",
    "join_async", "broadcast_object", "allgather_object", "start_timeline", "stop_timeline", "ReduceOp", "Handle",
    "HorovodInternalError", "TensorMismatchError",
    "HostsUpdatedInterrupt", "Settings", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set",
]

_engine = None
_init_lock = threading.Lock()
_atexit_registered = False
_initialized_mpi = False  # whether init() initialized MPI, which it then finalizes at exit
_warned_variables = set()  # ignored HOROVOD_* variables are named once per process
_log_handler = None  # the engine logger's handler, where hvdtrain added it
_unnamed_object_calls = {}  # per (kind, process set), since this engine started: names the n-th unnamed call


def init(comm=None, process_sets=None):
    """Start the engine on `comm` (an mpi4py communicator; MPI.COMM_WORLD by default).
    `process_sets`: ProcessSets (or lists of ranks) to register on every rank, or "dynamic" to
    allow add_process_set() later (as HOROVOD_DYNAMIC_PROCESS_SETS=1 does). As in Horovod, a set of
    all ranks is the global set, and a set given twice is refused. Calling it again while
    initialized does nothing."""
    global _engine, _atexit_registered
    dynamic = process_sets == "dynamic"
    if process_sets is None or dynamic:
        process_sets = []
    elif isinstance(process_sets, (ProcessSet, str)) or not hasattr(process_sets, "__iter__"):
        raise ValueError(f"init(process_sets=...) takes a list of process sets or 'dynamic', got {process_sets!r}")
    else:
        process_sets = [p if isinstance(p, ProcessSet) else ProcessSet(p) for p in process_sets]
    with _init_lock:
        if _engine is not None and _engine.alive:
            return
        if _engine is not None:  # it stopped on its own (a peer shut down, a stall): release it first
            _release(_engine)
            _engine = None
        settings = from_environment()
        _configure_logging(settings.log_level, settings.log_hide_time)
        _cuda.check_libraries()
        MPI = _start_mpi()
        from .engine import Engine

        comm = MPI.COMM_WORLD if comm is None else comm
        agreement = _process_sets.agree_at_init(comm, process_sets)
        _engine = Engine(comm, settings)
        _unnamed_object_calls.clear()
        _process_sets.start(comm, settings, _engine, process_sets, agreement, dynamic or settings.dynamic_process_sets)
        if _engine.rank == 0:
            _warn_about_ignored_variables()
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True


def _start_mpi():
    """mpi4py's MPI module, with MPI initialized: by mpi4py when it is first imported, or here
    when the script told mpi4py not to (`mpi4py.rc.initialize = False`, as in Horovod's
    process-set example); then it is finalized here at exit, since mpi4py will not."""
    global _initialized_mpi
    from mpi4py import MPI

    if MPI.Is_finalized():
        raise HorovodInternalError("MPI has been finalized in this process; hvdtrain cannot start again")
    if not MPI.Is_initialized():
        # Process sets run an engine thread each, all of them calling MPI.
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        _initialized_mpi = True
    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise HorovodInternalError(
            "MPI was initialized without thread support; hvdtrain's engine thread needs at least "
            "MPI_THREAD_SERIALIZED (set mpi4py.rc.thread_level = 'multiple' before importing mpi4py.MPI)"
        )
    return MPI


def _at_exit():
    shutdown()
    if _initialized_mpi:
        from mpi4py import MPI

        if not MPI.Is_finalized():
            MPI.Finalize()


def _warn_about_ignored_variables():
    for line in ignored_variables():
        if line not in _warned_variables:
            _warned_variables.add(line)
            logging.getLogger("hvdtrain.core").warning(line)


def _configure_logging(level, hide_time):
    """The engine's logger at `level`, with a handler of ours unless the program gave it one of
    its own, whose format then stays the program's."""
    global _log_handler
    logger = logging.getLogger("hvdtrain.core")
    logger.setLevel(level)
    if not logger.handlers:
        _log_handler = logging.StreamHandler()
        logger.addHandler(_log_handler)
    if _log_handler in logger.handlers:
        prefix = "[hvdtrain" if hide_time else "[%(asctime)s hvdtrain"
        _log_handler.setFormatter(logging.Formatter(prefix + " %(levelname)s] %(message)s"))


def shutdown():
    global _engine
    with _init_lock:
        engine, _engine = _engine, None
    _release(engine)


def _release(engine):
    """Stop the engines of the process sets and then `engine` (the global one, or None), so
    that the next init() starts with nothing left of them: sets, names, cache, timeline."""
    _process_sets.stop()
    if engine is not None:
        engine.shutdown()


def is_initialized():
    return _engine is not None and _engine.alive


def running_engine(process_set=None):
    """The engine of `process_set` (None: the global set, all ranks)."""
    if _engine is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if process_set is None or process_set is global_process_set:
        return _engine
    return _process_sets.engine_of(process_set)


def takes_part(process_set):
    """Whether this rank is a member of `process_set`. Horovod's optimizers and gradient tapes
    reduce nothing on a rank outside their set: it keeps its own gradients. Raises the usual
    error where hvd is not initialized or the set is not registered."""
    running_engine()
    if process_set.included() is False:
        return False
    running_engine(process_set)
    return True


def adasum_refusal(on_device=False, process_set=None):
    """Why ReduceOp.ADASUM cannot combine host (or, `on_device`, CUDA) buffers on the ranks of
    `process_set`, in the line its submission would be refused with; None where it can."""
    return running_engine(process_set).adasum_refusal(on_device)


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
                    output=None, bucket=None, process_set=None, stream=None) -> Handle:
    """Reduce `array` across ranks into `output` (default: into `array` itself).

    `bucket=(bucket_name, flat_array)` says that `array` is a view of `flat_array`, which holds
    other tensors too (a model's gradients, say) laid out alike on every rank; tensors that lie
    next to each other in a bucket are reduced as one region, without copies. ReduceOp.ADASUM
    combines each tensor by Adasum instead (adasum.py), on a power of two of ranks."""
    return running_engine(process_set).submit(ALLREDUCE, array, name=name, output=output, op=op,
                                              prescale=prescale_factor, postscale=postscale_factor, bucket=bucket,
                                              stream=stream)


def grouped_allreduce_async(arrays, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0,
                            postscale_factor=1.0, outputs=None, process_set=None, stream=None):
    """Reduce a list of arrays as one group: negotiated together and fused where possible."""
    return running_engine(process_set).submit_group(Kind.ALLREDUCE, arrays, name=name, outputs=outputs, op=op,
                                                    prescale=prescale_factor, postscale=postscale_factor,
                                                    stream=stream)


# `allocate(shape, dtype)`: for device buffers, makes an output whose size only the collective
# tells (the framework's allocator, so that its memory is the framework's own); default: CuPy.
# The grouped forms take one per array.


def allgather_async(array, name=None, process_set=None, stream=None, allocate=None) -> Handle:
    """Concatenate every rank's `array` along the first dimension, which may differ per rank."""
    return running_engine(process_set).submit(Kind.ALLGATHER, array, name=name, stream=stream, allocate=allocate)


def grouped_allgather_async(arrays, name=None, process_set=None, stream=None, allocate=None):
    """Allgather a list of arrays as one group, negotiated together."""
    return running_engine(process_set).submit_group(Kind.ALLGATHER, arrays, name=name, stream=stream,
                                                    allocate=allocate)


def broadcast_async(array, root_rank, name=None, output=None, process_set=None, stream=None) -> Handle:
    """Copy `root_rank`'s `array` into `output` (default: `array` itself) on every rank."""
    return running_engine(process_set).submit(Kind.BROADCAST, array, name=name, output=output, root=root_rank,
                                              stream=stream)


def alltoall_async(array, splits=None, name=None, process_set=None, stream=None, allocate=None) -> Handle:
    """Send `splits[i]` rows of `array` to the i-th rank (of the process set), in order; the
    handle gives (received rows, received splits). Without splits, rows are divided evenly."""
    engine = running_engine(process_set)
    n = engine.size
    if splits is None and getattr(array, "ndim", 0) and array.shape[0] % n == 0:
        splits = [array.shape[0] // n] * n  # otherwise the engine refuses the missing splits
    return engine.submit(Kind.ALLTOALL, array, name=name, splits=splits, stream=stream, allocate=allocate)


def reducescatter_async(array, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0,
                        postscale_factor=1.0, process_set=None, stream=None, allocate=None) -> Handle:
    """Reduce `array` across ranks and give each rank its share of the first dimension
    (the first `dim % size` ranks get one extra row)."""
    return running_engine(process_set).submit(Kind.REDUCESCATTER, array, name=name, op=op,
                                              prescale=prescale_factor, postscale=postscale_factor, stream=stream,
                                              allocate=allocate)


def grouped_reducescatter_async(arrays, name=None, op=ReduceOp.AVERAGE, prescale_factor=1.0,
                                postscale_factor=1.0, process_set=None, stream=None, allocate=None):
    """Reducescatter a list of arrays as one group, negotiated together."""
    return running_engine(process_set).submit_group(Kind.REDUCESCATTER, arrays, name=name, op=op,
                                                    prescale=prescale_factor, postscale=postscale_factor,
                                                    stream=stream, allocate=allocate)


def barrier_async(process_set=None) -> Handle:
    """Finishes once every rank (of the process set) has reached the barrier."""
    return running_engine(process_set).submit(Kind.BARRIER)


def barrier(process_set=None):
    """Return once every rank (of the process set) has called barrier()."""
    barrier_async(process_set).wait()


def join_async() -> Handle:
    """Declare that this rank has no more data. Until every rank has joined, the others'
    allreduces go on with this rank contributing zeros. The handle gives the last rank to join."""
    return running_engine().submit(Kind.JOIN, name="join")


def join():
    """join_async(), waited for: the last rank to join."""
    return join_async().wait()


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


def _next_object_name(kind, process_set):
    # Counted per set: ranks outside a set do not make its calls.
    key = (kind, 0 if process_set is None else process_set.process_set_id)
    count = _unnamed_object_calls.get(key, 0)
    _unnamed_object_calls[key] = count + 1
    return f"{kind}.{count}"


def _loads(payload):
    import cloudpickle

    return cloudpickle.loads(payload.tobytes())


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Pickle `obj` on `root_rank` and return a copy of it on every rank. Without a `name`, the
    n-th unnamed call is matched with the n-th on every rank: the name cannot come from `obj`,
    which non-root ranks often pass as None."""
    name = _next_object_name("broadcast_object", process_set) if name is None else name
    is_root = rank() == root_rank
    payload = _dumps(obj) if is_root else None
    length = np.array([payload.size if is_root else 0], np.int64)
    broadcast_async(length, root_rank, name=f"{name}.sz", process_set=process_set).wait()
    if not is_root:
        payload = np.empty(int(length[0]), np.uint8)
    broadcast_async(payload, root_rank, name=f"{name}.t", process_set=process_set).wait()
    return obj if is_root else _loads(payload)


def allgather_object(obj, name=None, process_set=None):
    """Return the list of every rank's `obj`, in rank order (unnamed calls match as in broadcast_object)."""
    name = _next_object_name("allgather_object", process_set) if name is None else name
    payload = _dumps(obj)
    lengths = allgather_async(np.array([payload.size], np.int64), name=f"{name}.sz", process_set=process_set).wait()
    gathered = allgather_async(payload, name=f"{name}.t", process_set=process_set).wait()
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    return [_loads(gathered[bounds[i]:bounds[i + 1]]) for i in range(len(lengths))]
