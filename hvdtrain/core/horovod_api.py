"""The part of Horovod's Python API that is the same for every framework: reduction ops,
topology queries, build flags, the deprecated `average=` argument and the identity
compressor. hvdtrain.torch and hvdtrain.tensorflow re-export these names."""

import warnings

from . import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ProcessSet,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from . import cuda as _cuda
from .requests import ReduceOp

# What `from hvdtrain.core.horovod_api import *` gives an adapter package to re-export.
__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "HorovodInternalError", "HostsUpdatedInterrupt",
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "start_timeline", "stop_timeline", "mpi_built", "mpi_enabled",
    "nccl_built", "gloo_built", "gloo_enabled", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
]

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


# What this install has, in Horovod's terms: MPI always; CUDA and NCCL where CuPy and its NCCL
# load (the `gpu` extra), as Horovod's when it was built with them.
def mpi_built():
    return True


def mpi_enabled():
    return True


def nccl_built():
    """NCCL's version code (e.g. 23007), or 0; true where CuPy loads NCCL."""
    return _cuda.nccl_built()


def cuda_built():
    return _cuda.cuda_built()


def gloo_built():
    return False


gloo_enabled = ddl_built = ccl_built = rocm_built = gloo_built


def handle_average_backwards_compatibility(op, average):
    """Horovod's reading of the deprecated `average=` beside `op=` (default: Average)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


class NoneCompressor:
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
