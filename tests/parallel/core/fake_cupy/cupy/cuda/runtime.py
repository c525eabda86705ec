"""cupy.cuda.runtime: events complete at once; each rank has FAKE_GPUS devices, and its PCI bus
ids are its own unless FAKE_GPU_SHARED=1 (every rank of the host then sees the same GPU)."""

import itertools
import os
import threading

eventDisableTiming = 2
_events = itertools.count(1)
_current = threading.local()


def runtimeGetVersion():
    return 13020


def getDeviceCount():
    return int(os.environ.get("FAKE_GPUS", "1"))


def getDevice():
    return getattr(_current, "device", 0)


def setDevice(device):
    _current.device = device


def deviceGetPCIBusId(device):
    rank = "0" if os.environ.get("FAKE_GPU_SHARED") == "1" else os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    return f"0000:{int(rank):02x}:{device:02x}.0"


def eventCreateWithFlags(flags):
    return next(_events)


def eventRecord(event, stream):
    pass


def streamWaitEvent(stream, event, flags=0):
    pass


def eventQuery(event):
    return 0


def eventSynchronize(event):
    pass


def eventDestroy(event):
    pass
