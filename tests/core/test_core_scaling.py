"""prescale_factor and postscale_factor give Horovod's results for every reducible dtype: each
rank's input is scaled, the scaled inputs are reduced, the result is scaled, and a scaling is done
as Horovod's ScaleBuffer does it: integers in float64 and truncated, float32 and float64 in their
own precision, float16 and bfloat16 in float32 (a factor rounded to 16 bits is off by as much
as the result's own rounding). The reference is computed in float64 with those roundings, and
results must equal it exactly: Horovod's own tolerance at 3 ranks or fewer is 0."""

import ml_dtypes
import numpy as np

from hvdtrain import core
from hvdtrain.core import ReduceOp
from hvdtrain.core.mpi_backend import REDUCIBLE_DTYPES
from hvdtrain.core.requests import numpy_dtype

# Large: reduced where it lies in 1 MiB pieces; small: packed into the fusion buffer.
SHAPES = ((17,), (5, 17), (300_000 // 2 * 2,))
FACTORS = ((1 / 3, 0.7), (0.6180339887, 1 / 7), (2.3, 1.0))  # (prescale, postscale)


def compute_dtype(dtype):
    """The precision in which Horovod multiplies a buffer of `dtype` by a factor."""
    if dtype.kind in "iu":
        return np.dtype(np.float64)
    return np.dtype(np.float32) if dtype.itemsize == 2 else dtype


def scaled(values, factor, dtype):
    """`values` (float64, exact in `dtype`) scaled as Horovod does, rounded to `dtype`, as float64.
    The product of two numbers of 24 bits or fewer is exact in float64, so rounding it to the
    compute dtype gives what a multiplication in that dtype gives."""
    compute = compute_dtype(dtype)
    product = np.float64(compute.type(factor)) * values
    if dtype.kind in "iu":
        return np.trunc(product)
    return product.astype(compute).astype(dtype).astype(np.float64)


def rank_input(rank, dtype, shape, salt):
    rng = np.random.default_rng((rank, salt))
    low, high = {"uint8": (0, 20), "int8": (-20, 20), "uint16": (0, 100)}.get(dtype.name, (-100, 100))
    return rng.integers(low, high, shape).astype(np.float64)


def reference(inputs, dtype, op, prescale, postscale):
    """Sum (or average) of the ranks' scaled inputs; a sum of two values rounded once, as MPI
    rounds it."""
    total = sum(scaled(x, prescale, dtype) for x in inputs)
    if dtype.kind not in "iu":
        total = total.astype(dtype).astype(np.float64)
    return scaled(total, postscale / len(inputs) if op == ReduceOp.AVERAGE else postscale, dtype)


def difference(label, got, expected, dtype):
    got = np.asarray(got)
    if got.dtype != dtype:
        return f"{label}: got dtype {got.dtype}, expected {dtype}"
    wrong = np.flatnonzero(got.astype(np.float64).reshape(-1) != expected.reshape(-1))
    if wrong.size == 0:
        return None
    i = wrong[0]
    return (f"{label}: {wrong.size} of {got.size} elements differ, first at {i}: got "
            f"{got.reshape(-1)[i]!r}, expected {expected.reshape(-1)[i]!r}")


def ranks_scaling():
    core.init()
    n, me = core.size(), core.rank()
    failures = []
    for d, dtype in enumerate(map(numpy_dtype, sorted(REDUCIBLE_DTYPES))):
        for (f, (prescale, postscale)), op in zip(enumerate(FACTORS), (ReduceOp.SUM, ReduceOp.AVERAGE) * 2):
            options = dict(op=op, prescale_factor=prescale, postscale_factor=postscale)
            inputs = [[rank_input(r, dtype, shape, (d, f, s)) for s, shape in enumerate(SHAPES)] for r in range(n)]
            expected = [reference([inputs[r][s] for r in range(n)], dtype, op, prescale, postscale)
                        for s in range(len(SHAPES))]
            mine = [x.astype(dtype) for x in inputs[me]]
            label = f"{dtype} {op.name} prescale {prescale:.4g} postscale {postscale:.4g}"

            singles = [core.allreduce_async(x.copy(), name=f"{label} {s}", **options) for s, x in enumerate(mine)]
            grouped = core.grouped_allreduce_async([x.copy() for x in mine], name=f"{label} grouped", **options)
            for form, handles in (("allreduce", singles), ("grouped allreduce", grouped)):
                for s, handle in enumerate(handles):
                    failures.append(difference(f"{form} {label} shape {SHAPES[s]}", handle.wait(), expected[s], dtype))

            # Reducescatter: each rank gets its rows of the same reduction (the first ranks one more).
            scattered = [core.reducescatter_async(mine[0].copy(), name=f"{label} rs", **options)]
            scattered += core.grouped_reducescatter_async([x.copy() for x in mine[1:]], name=f"{label} grouped rs",
                                                          **options)
            for s, handle in enumerate(scattered):
                share = np.array_split(expected[s], n)[me]
                failures.append(difference(f"reducescatter {label} shape {SHAPES[s]}", handle.wait(), share, dtype))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures[:20])


def test_scaling_matches_horovod_for_every_dtype(mpirun):
    mpirun(2, ranks_scaling, timeout=240)


def test_half_precision_is_scaled_in_float32():
    """The engine's own scaling, on one process: the factor is not rounded to 16 bits first."""
    from hvdtrain.core.mpi_backend import _scale

    for dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        values = np.arange(-100, 100, dtype=np.float64)
        destination = np.empty(values.size, dtype)
        _scale(destination, 1 / 3, values.astype(dtype))
        assert np.array_equal(destination.astype(np.float64), scaled(values, 1 / 3, dtype)), dtype
