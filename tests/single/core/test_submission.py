"""What a submission is checked for before the engine sees it (hvdtrain/core/submission.py), for
device buffers, without a GPU: which device a buffer is requested on, the dtypes NCCL cannot
reduce (refused naming the way through host memory), a device tensor with a host output, and the
hosts Adasum of device buffers needs.
The refusals on real ranks are in tests/parallel/core/test_submission.py."""

import numpy as np
import pytest

from hvdtrain.core.discovery import Topology
from hvdtrain.core.requests import Kind, ReduceOp
from hvdtrain.core.settings import from_environment
from hvdtrain.core.submission import Submissions


class FakeDeviceArray:
    """What the submission checks read of a CuPy array, with no device behind it."""

    __cuda_array_interface__ = {}

    def __init__(self, shape, dtype, contiguous=True):
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
        self.flags = type("Flags", (), {"c_contiguous": contiguous})()


def _topology(hosts):
    """Rank 0's view of a job with `hosts[i]` ranks on host i."""
    names = tuple(f"host{i}" for i, ranks in enumerate(hosts) for _ in range(ranks))
    return Topology(0, len(names), 0, hosts[0], 0, len(hosts), len(set(hosts)) == 1, names)


def _validate(kind, array, env=None, output=None, op=ReduceOp.SUM, hosts=(2,)):
    topology = _topology(hosts)
    submissions = Submissions(topology.size, tuple(range(topology.size)), from_environment(env or {}), is_world=True,
                              topology=topology)
    return submissions._validate(kind, "t", array, output, op, 1.0, 1.0, 0, None, None)


def test_device_buffers_are_requested_as_cuda_and_host_buffers_as_cpu():
    assert _validate(Kind.ALLREDUCE, FakeDeviceArray((4, 3), np.float32)).device == "cuda"
    assert _validate(Kind.ALLREDUCE, np.zeros((4, 3), np.float32)).device == "cpu"


def test_nccl_refuses_16_bit_integers_and_names_the_way_through_host_memory():
    with pytest.raises(TypeError, match="NCCL cannot reduce dtype int16.*HOROVOD_GPU_ALLREDUCE=MPI"):
        _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.int16))
    with pytest.raises(TypeError, match="HOROVOD_GPU_REDUCESCATTER=MPI"):
        _validate(Kind.REDUCESCATTER, FakeDeviceArray((4,), np.uint16))
    staged = _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.int16), env={"HOROVOD_GPU_ALLREDUCE": "MPI"})
    assert (staged.device, staged.dtype) == ("cuda", "int16")
    # Moving bytes needs no reduction: NCCL gathers any dtype.
    assert _validate(Kind.ALLGATHER, FakeDeviceArray((4,), np.int16)).dtype == "int16"


def test_a_device_tensor_with_a_host_output_is_refused():
    with pytest.raises(TypeError, match="output must be a CUDA \\(CuPy\\) array like the tensor, got ndarray"):
        _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.float32), output=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="must be contiguous"):
        _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.float32, contiguous=False))


def test_adasum_of_device_buffers_through_nccl_needs_a_power_of_two_of_hosts_alike():
    array = FakeDeviceArray((4,), np.float32)
    assert _validate(Kind.ALLREDUCE, array, op=ReduceOp.ADASUM, hosts=(3, 3)).op == ReduceOp.ADASUM
    with pytest.raises(NotImplementedError, match="a power of two of hosts; this job has 3 hosts \\(with HOROVOD_GPU"):
        _validate(Kind.ALLREDUCE, array, op=ReduceOp.ADASUM, hosts=(2, 2, 2))
    with pytest.raises(NotImplementedError, match="this job has 2 hosts with different numbers of ranks"):
        _validate(Kind.ALLREDUCE, array, op=ReduceOp.ADASUM, hosts=(2, 1))


def test_adasum_of_device_buffers_through_mpi_needs_a_power_of_two_of_ranks():
    array, through_mpi = FakeDeviceArray((4,), np.float32), {"HOROVOD_GPU_ALLREDUCE": "MPI"}
    assert _validate(Kind.ALLREDUCE, array, through_mpi, op=ReduceOp.ADASUM, hosts=(2, 2)).op == ReduceOp.ADASUM
    with pytest.raises(NotImplementedError, match="Adasum needs a power of two of ranks; this job has 6"):
        _validate(Kind.ALLREDUCE, array, through_mpi, op=ReduceOp.ADASUM, hosts=(3, 3))
