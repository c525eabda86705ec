"""The host backend's own scaling (hvdtrain/core/mpi_backend.py), in this process: a 16-bit float
is scaled in float32, as Horovod's ScaleBuffer does, so the factor is not rounded to 16 bits
first. Reductions on real ranks are in tests/parallel/core/test_mpi_backend.py."""

import ml_dtypes
import numpy as np

from hvdtrain.core.mpi_backend import _scale


def test_half_precision_is_scaled_in_float32():
    for dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        values = np.arange(-100, 100, dtype=np.float64)
        destination = np.empty(values.size, dtype)
        _scale(destination, 1 / 3, values.astype(dtype))
        # The product of two numbers of 24 bits or fewer is exact in float64: rounded to float32,
        # it is what a multiplication in float32 gives.
        expected = (np.float64(np.float32(1 / 3)) * values).astype(np.float32).astype(dtype)
        assert np.array_equal(destination.astype(np.float64), expected.astype(np.float64)), dtype
