"""A host-memory stand-in for CuPy (see ../README.md)."""

import ctypes

import numpy as np

from . import cuda  # noqa: F401  (cupy.cuda, as CuPy has it)


class _Device:
    def __init__(self, device_id):
        self.id = device_id


class _Pointer:
    def __init__(self, owner, ptr):
        self._owner, self.ptr = owner, ptr

    def copy_to_host_async(self, destination, size, stream=None):
        ctypes.memmove(destination, self.ptr, size)

    def copy_from_host_async(self, source, size, stream=None):
        ctypes.memmove(self.ptr, source, size)


class ndarray:
    """A NumPy array posing as device memory on device `cuda.runtime.device()`."""

    def __init__(self, host):
        self._host = host
        self.device = _Device(cuda.runtime.getDevice())

    __cuda_array_interface__ = property(lambda self: {"shape": self.shape, "version": 3})
    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    itemsize = property(lambda self: self._host.itemsize)
    ndim = property(lambda self: self._host.ndim)
    flags = property(lambda self: self._host.flags)
    data = property(lambda self: _Pointer(self, self._host.ctypes.data))

    def __getitem__(self, key):
        return ndarray(self._host[key])

    def view(self, dtype):
        return ndarray(self._host.view(dtype))

    def reshape(self, *shape):
        return ndarray(self._host.reshape(*shape))

    def set(self, host):
        self._host[...] = host

    def fill(self, value):
        self._host.fill(value)

    def get(self):
        return self._host.copy()


def _host(value):
    return value._host if isinstance(value, ndarray) else value


def empty(shape, dtype=np.float32):
    return ndarray(np.empty(shape, dtype))


def zeros(shape, dtype=np.float32):
    return ndarray(np.zeros(shape, dtype))


def empty_like(array):
    return ndarray(np.empty_like(_host(array)))


def asarray(value):
    return value if isinstance(value, ndarray) else ndarray(np.array(value))


def multiply(a, b, out=None, dtype=None, casting="same_kind"):
    np.multiply(_host(a), _host(b), out=_host(out), dtype=dtype, casting=casting)
    return out


class RawKernel:
    """Only the batched copy: rows of (destination, source, bytes) as the kernel reads them."""

    def __init__(self, code, name):
        assert name == "hvdtrain_batched_copy" and "extern \"C\" __global__" in code

    def __call__(self, grid, block, args):
        table, count = args
        for destination, source, nbytes in _host(table).reshape(int(count), 3).tolist():
            ctypes.memmove(destination, source, nbytes)
