"""A CPU-only install (hvdtrain/core/cuda.py), in a process of its own whose CuPy import fails:
host collectives work, a device buffer is refused naming the extra to install, and nccl_built()
and cuda_built() say no. The checks of CUDA and NCCL versions are in tests/single/core/test_cuda.py."""

import sys

import numpy as np


class FakeDeviceArray:
    """What the submission checks read of a CuPy array, with no device behind it."""

    __cuda_array_interface__ = {}

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
        self.flags = type("Flags", (), {"c_contiguous": True})()


def a_cpu_only_install_works_and_refuses_device_buffers_naming_the_extra(fake_package_dir):
    sys.path.insert(0, fake_package_dir)
    import torch

    import hvdtrain.torch as hvd
    from hvdtrain import core
    from hvdtrain.core.cuda import DeviceSupportMissing

    hvd.init()
    assert hvd.cuda_built() is False and hvd.nccl_built() == 0
    assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [1.0, 1.0, 1.0]
    try:
        core.allreduce_async(FakeDeviceArray((3,), np.float32), name="on_gpu")
    except DeviceSupportMissing as error:
        assert "a CUDA buffer needs CuPy" in str(error) and "hvdtrain[gpu]" in str(error), error
    else:
        raise AssertionError("a device buffer without CuPy was accepted")


def test_a_cpu_only_install_works_and_refuses_device_buffers_naming_the_extra(ranks, tmp_path):
    broken = tmp_path / "cupy"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('No module named cupy (hidden by the test)')\n")
    ranks.alone([a_cpu_only_install_works_and_refuses_device_buffers_naming_the_extra], str(tmp_path)).assert_passed(
        a_cpu_only_install_works_and_refuses_device_buffers_naming_the_extra)
