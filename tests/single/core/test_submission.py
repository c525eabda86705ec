"""What a submission is checked for before the engine sees it (hvdtrain/core/submission.py), for
device buffers, without a GPU: which device a buffer is requested on, the dtypes NCCL cannot
reduce (refused naming the way through host memory), and a device tensor with a host output.
The refusals on real ranks are in tests/parallel/core/test_submission.py."""

import numpy as np
import pytest

from hvdtrain.core.requests import Kind, ReduceOp
from hvdtrain.core.settings import from_environment
from hvdtrain.core.submission import Submissions


class FakeDeviceArray:
    """What the submission checks read of a CuPy array, with no device behind it."""

    __cuda_array_interface__ = {}

    def __init__(self, shape, dtype, contiguous=True):
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
        self.flags = type("Flags", (), {"c_contiguous": contiguous})()


def _validate(kind, array, env=None, output=None, op=ReduceOp.SUM):
    submissions = Submissions(2, (0, 1), from_environment(env or {}), is_world=True)
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
