"""CUDA for the core, through CuPy: imported only when a device buffer or a GPU question
appears, so that a CPU-only install never needs CuPy.

Device buffers are CuPy arrays over the framework's memory (no copies). Ordering follows
Horovod's: a submission records a *ready* event on the caller's current stream; the engine's
stream waits for it before reading the buffer; after the collective the engine records a
*done* event, and the caller's stream waits for that (Handle.wait). The host blocks on the
GPU only where the caller reads a result on the CPU.
"""

import collections
import contextlib
import functools
import importlib.util
import re
import sys

from .exceptions import HorovodInternalError

# The extra that brings the CuPy wheel built for each CUDA major version (pyproject.toml).
EXTRAS = {13: "gpu", 12: "gpu-cu12"}
INSTALL_HINT = "install hvdtrain's GPU extra matching your torch build: pip install 'hvdtrain[gpu]' " \
               "(CUDA 13 torch, cupy-cuda13x) or 'hvdtrain[gpu-cu12]' (CUDA 12 torch, cupy-cuda12x)"


class DeviceSupportMissing(NotImplementedError):
    """A device buffer where CuPy or NCCL cannot be loaded (refused at submission)."""


@functools.lru_cache(maxsize=None)
def _import_cupy():
    try:
        import cupy
    except ImportError as error:
        return None, f"CuPy cannot be imported ({error})"
    return cupy, None


def cupy():
    """The cupy module; raises DeviceSupportMissing naming the extra to install."""
    module, problem = _import_cupy()
    if module is None:
        raise DeviceSupportMissing(f"hvdtrain: a CUDA buffer needs CuPy: {problem}; {INSTALL_HINT}")
    return module


def nccl():
    """cupy.cuda.nccl with its library loaded; raises DeviceSupportMissing otherwise."""
    cupy()  # a missing CuPy is refused naming the extra, before its submodule is imported
    from cupy.cuda import nccl as module

    if not module.available:
        raise DeviceSupportMissing(f"hvdtrain: CuPy cannot load the NCCL library; {INSTALL_HINT}, "
                                   "or set HOROVOD_GPU_OPERATIONS=MPI to stage GPU buffers through host memory")
    return module


def installed():
    """Whether CuPy is installed, without importing it."""
    return importlib.util.find_spec("cupy") is not None


def imported():
    """Whether this process has imported CuPy (a device buffer or a GPU question came up)."""
    return "cupy" in sys.modules


@contextlib.contextmanager
def thread_state_kept(device):
    """Keep the calling thread's current CUDA device and CuPy's current stream on `device` as
    they were: device backends set both for their own stream (nccl_backend._DeviceStream.enter),
    which must not leak into a caller whose thread runs an engine cycle (Engine.hurry)."""
    cp = cupy()
    previous_device = cp.cuda.runtime.getDevice()
    previous_stream = cp.cuda.get_current_stream(device)
    try:
        yield
    finally:
        previous_stream.use()
        cp.cuda.runtime.setDevice(previous_device)


def cuda_built():
    """Horovod's cuda_built(): True when CuPy loads."""
    return installed() and _import_cupy()[0] is not None


def nccl_built():
    """Horovod's nccl_built(): the NCCL version code (e.g. 23007 for 2.30.7) when CuPy and its
    NCCL load, else 0."""
    if not cuda_built():
        return 0
    try:
        return nccl().get_version()
    except DeviceSupportMissing:
        return 0


def is_device_array(obj):
    """Whether `obj` is device memory (a CuPy array, or anything with the CUDA array interface)."""
    return hasattr(obj, "__cuda_array_interface__")


# ----------------------------------------------------------------------------- one runtime, one NCCL

# The framework adapters tell the core which CUDA and NCCL their framework was built with
# (hvdtrain.torch: torch.version.cuda and torch.cuda.nccl.version()), checked at init().
_frameworks = {}


def declare_framework(name, describe):
    """`describe()` -> (CUDA version string such as "13.0", NCCL version tuple or None), or None
    where the framework has no usable CUDA; called at init()."""
    _frameworks[name] = describe


def check_libraries():
    """At init(): refuse a process whose framework and CuPy were built for different CUDA major
    versions, or that has two NCCL libraries loaded, naming both versions. Nothing is imported
    where CuPy is not installed or no framework uses CUDA."""
    described = {name: describe() for name, describe in _frameworks.items()}
    described = {name: versions for name, versions in described.items() if versions is not None}
    if not described or not cuda_built():
        return
    problem = library_mismatch(described, cupy().cuda.runtime.runtimeGetVersion(), nccl_built(),
                               loaded_libraries("nccl"))
    if problem:
        raise HorovodInternalError(f"hvdtrain: {problem}")


def library_mismatch(frameworks, cupy_cuda, cupy_nccl, nccl_files):
    """What is wrong, in one line, or None. `frameworks`: name -> (CUDA "major.minor", NCCL
    (major, minor, patch) or None); `cupy_cuda`: CuPy's CUDA runtime version code (13020 for
    13.2); `cupy_nccl`: the NCCL version code CuPy loaded (23007 for 2.30.7, 0 if none);
    `nccl_files`: the NCCL libraries mapped into this process."""
    cupy_major = cupy_cuda // 1000
    for name, (cuda_version, nccl_version) in sorted(frameworks.items()):
        major = int(str(cuda_version).split(".")[0])
        if major != cupy_major:
            extra = EXTRAS.get(major)
            fix = f"install hvdtrain[{extra}]" if extra else "use a torch build for CUDA 12 or 13"
            return (f"{name} is built for CUDA {cuda_version} but CuPy for CUDA {cupy_major}.{cupy_cuda % 1000 // 10}: "
                    f"one process must not load two CUDA runtimes; {fix} (the CuPy wheel for CUDA {major})")
        if nccl_version is not None and cupy_nccl and nccl_code(nccl_version) != cupy_nccl:
            return (f"{name} uses NCCL {'.'.join(map(str, nccl_version))} but CuPy loaded NCCL "
                    f"{nccl_release(cupy_nccl)}: one process must not load two NCCL libraries; install the "
                    f"CuPy wheel that loads {name}'s NCCL (hvdtrain[{EXTRAS.get(major, 'gpu')}])")
    if len(nccl_files) > 1:
        return f"two NCCL libraries are loaded in this process: {', '.join(nccl_files)}"
    return None


def nccl_code(version):
    """NCCL's version code of (major, minor, patch), as ncclGetVersion() gives it."""
    major, minor, patch = version
    if major <= 2 and minor <= 8:
        return major * 1000 + minor * 100 + patch
    return major * 10000 + minor * 100 + patch


def nccl_release(code):
    """'2.30.7' for 23007 (and '2.8.4' for 2804)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def loaded_libraries(family, maps_path="/proc/self/maps"):
    """The distinct files of lib<family>.so* mapped into this process (Linux)."""
    pattern = re.compile(rf"/lib{family}\.so[.\d]*$")
    try:
        with open(maps_path) as maps:
            return sorted({line.split()[-1] for line in maps if pattern.search(line.rstrip())})
    except OSError:
        return []


# ----------------------------------------------------------------------------- events

class EventPool:
    """CUDA events without timing, reused: a submission records one per tensor, every step.
    An event may be recorded again as soon as every wait on it has been enqueued (a stream
    waits for the work the event captured when the wait was enqueued)."""

    def __init__(self):
        self._free = collections.defaultdict(list)  # device -> event handles

    def take(self, device):
        free = self._free[device]
        try:
            return free.pop()  # list.pop is atomic: submitting threads and the engine share the pool
        except IndexError:
            runtime = cupy().cuda.runtime
            with cupy().cuda.Device(device):
                return runtime.eventCreateWithFlags(runtime.eventDisableTiming)

    def give_back(self, device, event):
        self._free[device].append(event)


events = EventPool()


def record_ready(device, stream):
    """An event recorded now on the caller's `stream` (a cudaStream_t as an int)."""
    event = events.take(device)
    cupy().cuda.runtime.eventRecord(event, stream)
    return event


def current_stream(device):
    """CuPy's current stream on `device`, for callers that give none."""
    return cupy().cuda.get_current_stream(device).ptr


class DoneEvent:
    """The completion of a step on the engine's stream, which the caller's stream waits for
    (wait_on). Not pooled: callers may wait on it at any later time."""

    __slots__ = ("ptr", "device")

    def __init__(self, device, stream):
        runtime = cupy().cuda.runtime
        self.device = device
        self.ptr = runtime.eventCreateWithFlags(runtime.eventDisableTiming)
        runtime.eventRecord(self.ptr, stream)

    def wait_on(self, stream):
        cupy().cuda.runtime.streamWaitEvent(stream, self.ptr)

    @property
    def done(self):
        return cupy().cuda.runtime.eventQuery(self.ptr) == 0

    def __del__(self):
        module, _ = _import_cupy()
        if module is not None and self.ptr:
            try:
                module.cuda.runtime.eventDestroy(self.ptr)
            except Exception:  # at interpreter exit CUDA may be gone already
                pass
