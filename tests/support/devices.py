"""The core's device backends on a stand-in for CuPy whose device memory is host memory
(tests/parallel/core/fake_cupy/README.md)."""

import contextlib
import os
import sys
from pathlib import Path

from hvdtrain import core

FAKE_CUPY = str(Path(__file__).resolve().parents[1] / "parallel" / "core" / "fake_cupy")


@contextlib.contextmanager
def fake_gpus(transport, shared=False):
    """The engine started with HOROVOD_GPU_OPERATIONS=`transport` on the stand-in CuPy (with
    FAKE_GPU_SHARED=1, every rank sees the same GPU), then stopped and the variables restored."""
    if FAKE_CUPY not in sys.path:
        sys.path.insert(0, FAKE_CUPY)
    os.environ["HOROVOD_GPU_OPERATIONS"] = transport
    if shared:
        os.environ["FAKE_GPU_SHARED"] = "1"
    import cupy

    assert "fake_cupy" in cupy.__file__
    try:
        core.init()
        yield cupy
    finally:
        core.shutdown()
        os.environ.pop("HOROVOD_GPU_OPERATIONS")
        os.environ.pop("FAKE_GPU_SHARED", None)
