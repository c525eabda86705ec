"""cupy.cuda's streams, devices and pinned memory, on the host."""

from . import nccl, runtime  # noqa: F401


class Stream:
    _next = 1

    def __init__(self, null=False, non_blocking=False):
        self.ptr = 0 if null else Stream._next
        Stream._next += 1

    @classmethod
    def from_external(cls, obj):
        version, ptr = obj.__cuda_stream__()
        stream = cls()
        stream.ptr = ptr
        return stream

    def use(self):
        return self

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def get_current_stream(device_id=-1):
    return Stream(null=True)


class Device:
    def __init__(self, device_id=None):
        self.id = runtime.getDevice() if device_id is None else device_id

    def __enter__(self):
        self._previous = runtime.getDevice()
        runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc):
        runtime.setDevice(self._previous)

    def use(self):
        runtime.setDevice(self.id)


def alloc_pinned_memory(nbytes):
    return bytearray(nbytes)
