"""Reductions in host memory on real ranks (hvdtrain/core/mpi_backend.py) give exactly what NumPy
computes from every rank's known inputs: allreduce for every op, scale factor, dtype and shape (in
place, into an output, grouped), reducescatter, tensors in a bucket, on 2, 3 and 4 ranks and alone;
the same bits whatever the fusion settings and on every rank; and Horovod's scaling for every
reducible dtype.

Inputs are small integers (times 1/4 for floats) and scale factors are powers of two, so every
sum, product and scaling is exact in every dtype and results compare bit for bit. One exception:
AVERAGE on a float dtype when the size is not a power of two. The engine multiplies by
postscale/size rounded to the dtype, as Horovod does, so the result may differ from the
correctly rounded quotient by a unit in the last place; those compare within 2 eps relative.

The scaling checks use factors that are not powers of two: each rank's input is scaled, the
scaled inputs are reduced, the result is scaled, and a scaling is done as Horovod's ScaleBuffer
does it: integers in float64 and truncated, float32 and float64 in their own precision, float16
and bfloat16 in float32 (a factor rounded to 16 bits is off by as much as the result's own
rounding). The reference is computed in float64 with those roundings, and results must equal it
exactly: Horovod's own tolerance at 3 ranks or fewer is 0.
"""

import itertools
import math
import os
import time

import ml_dtypes
import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import ReduceOp
from hvdtrain.core.mpi_backend import REDUCIBLE_DTYPES
from hvdtrain.core.requests import numpy_dtype

DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
SMALL_SHAPES = ((), (7,), (3, 5), (2, 3, 4))
# Above the 1 MiB chunk: reduced where it lies, in pieces (Average and a postscale scale each piece
# as soon as it is reduced); the small ones are fused.
LARGE_BYTES = 5 * 1024 * 1024 + 1000
# (op, prescale_factor, postscale_factor). On integers the factors truncate toward zero.
REDUCTIONS = (
    (ReduceOp.AVERAGE, 1.0, 1.0), (ReduceOp.SUM, 1.0, 1.0), (ReduceOp.MIN, 1.0, 1.0),
    (ReduceOp.MAX, 1.0, 1.0), (ReduceOp.PRODUCT, 1.0, 1.0), (ReduceOp.SUM, 0.5, 2.0),
    (ReduceOp.AVERAGE, 0.5, 0.25), (ReduceOp.MAX, 2.0, 0.5),
)
PRODUCT_FLOATS = (-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0)
COMBINE = {ReduceOp.AVERAGE: np.add, ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
           ReduceOp.PRODUCT: np.multiply}


def sample(seed, dtype, shape, op=ReduceOp.SUM):
    """One rank's input: values whose sums (over up to 4 ranks), products and power-of-two
    scalings are exact in `dtype` and stay inside its range."""
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(dtype)
    if dtype.kind in "iu":
        bound = 3 if op == ReduceOp.PRODUCT else {"uint8": 60, "int8": 30}.get(dtype.name, 1000)
        values = rng.integers(0 if dtype.kind == "u" else -bound, bound + 1, shape, dtype=np.int32)
    elif op == ReduceOp.PRODUCT:
        values = rng.choice(PRODUCT_FLOATS, shape)
    else:
        bound = 60 if dtype.itemsize == 2 else 10**6
        values = rng.integers(-bound, bound + 1, shape, dtype=np.int32) / 4
    return np.array(values, dtype)  # an array even when 0-d


def reference(inputs, op, prescale=1.0, postscale=1.0):
    """The reduction of every rank's input, computed exactly in float64 (Horovod's semantics:
    scale each input, combine, scale the result; integers truncate after each scaling)."""
    integer = inputs[0].dtype.kind in "iu"

    def scaled(x, factor):
        x = np.array(x, np.float64)  # a fresh array, even when 0-d
        if factor != 1.0:
            x *= factor
            if integer:
                np.trunc(x, out=x)
        return x

    result = scaled(inputs[0], prescale)
    for x in inputs[1:]:
        COMBINE[op](result, scaled(x, prescale), out=result)
    return scaled(result, postscale / len(inputs) if op == ReduceOp.AVERAGE else postscale)


def mismatch(label, got, expected, dtype, op):
    """A description of how `got` differs from the float64 `expected`, or None if it does not."""
    dtype = numpy_dtype(dtype)
    got = np.asarray(got)
    if got.dtype != dtype or got.shape != expected.shape:
        return f"{label}: got dtype {got.dtype} shape {got.shape}, expected {dtype} {expected.shape}"
    size = core.size()
    inexact = op == ReduceOp.AVERAGE and dtype.kind not in "iu" and size & (size - 1)
    values = got.astype(np.float64)
    if inexact:
        good = np.abs(values - expected) <= 2 * ml_dtypes.finfo(dtype).eps * np.abs(expected)
    else:
        good = values == expected
    if good.all():
        return None
    where = np.flatnonzero(~good.reshape(-1))
    return (f"{label}: {where.size} of {good.size} elements wrong, first at {where[0]}: "
            f"got {values.reshape(-1)[where[0]]}, expected {expected.reshape(-1)[where[0]]}")


# ----------------------------------------------------------------------------- allreduce, reducescatter


def allreduce_is_exact_for_every_op_scale_dtype_shape_and_form():
    """Every (op, scale) x dtype x shape, submitted in five ways (in place by default, in place
    through output=input, into an output, grouped in place, grouped into outputs)."""
    core.init()
    n, me = core.size(), core.rank()
    launched = []
    for (r, (op, prescale, postscale)), (d, dtype) in itertools.product(enumerate(REDUCTIONS), enumerate(DTYPES)):
        shapes = SMALL_SHAPES
        if r == d % len(REDUCTIONS):  # one large tensor per dtype, each with another reduction
            shapes += ((LARGE_BYTES // numpy_dtype(dtype).itemsize,),)
        inputs = [[sample((rank, r, d, s), dtype, shape, op) for s, shape in enumerate(shapes)] for rank in range(n)]
        arrays = [x.copy() for x in inputs[me]]
        form = (r + d) % 5
        outputs = [np.empty_like(x) for x in arrays] if form in (2, 4) else [None] * len(arrays)
        options = dict(op=op, prescale_factor=prescale, postscale_factor=postscale)
        name = f"{op.name}.{prescale}.{postscale}.{dtype}"
        if form <= 2:
            handles = [core.allreduce_async(x, name=f"{name}_{s}", output=x if form == 1 else out, **options)
                       for s, (x, out) in enumerate(zip(arrays, outputs))]
        else:
            handles = core.grouped_allreduce_async(arrays, name=name, outputs=None if form == 3 else outputs,
                                                   **options)
        launched.append((name, op, prescale, postscale, dtype, inputs, arrays, outputs, handles, form))

    failures = []
    for name, op, prescale, postscale, dtype, inputs, arrays, outputs, handles, form in launched:
        for s, handle in enumerate(handles):
            got = handle.wait()
            label = f"allreduce {name}_{s} (form {form}, shape {arrays[s].shape})"
            if outputs[s] is None:
                failures += [f"{label}: result is not the input array"] if got is not arrays[s] else []
            else:
                failures += [f"{label}: result is not the output array"] if got is not outputs[s] else []
                failures += [f"{label}: input changed"] if not np.array_equal(arrays[s], inputs[me][s]) else []
            expected = reference([inputs[rank][s] for rank in range(n)], op, prescale, postscale)
            failures.append(mismatch(label, got, expected, dtype, op))
    failures = [f for f in failures if f]
    assert not failures, f"{len(failures)} wrong allreduce results on rank {me}:\n" + "\n".join(failures[:30])
    core.shutdown()


def reducescatter_is_exact_with_uneven_first_dimensions():
    """The first `rows % n` ranks get one extra row; with n - 1 rows the last rank gets none."""
    core.init()
    n, me = core.size(), core.rank()
    failures = []
    for case, ((rows, trailing), dtype, (op, prescale, postscale)) in enumerate(itertools.product(
        ((2 * n + 1, (3,)), (n - 1, (2, 2)), (4 * n, ())), ("int32", "bfloat16", "float32", "float64"),
        ((ReduceOp.SUM, 1.0, 1.0), (ReduceOp.AVERAGE, 1.0, 1.0), (ReduceOp.SUM, 0.5, 4.0), (ReduceOp.MIN, 1.0, 1.0)),
    )):
        inputs = [sample((rank, case), dtype, (rows,) + trailing) for rank in range(n)]
        got = core.reducescatter_async(inputs[me].copy(), name=f"rs.{rows}.{dtype}.{op.name}.{prescale}", op=op,
                                       prescale_factor=prescale, postscale_factor=postscale).wait()
        base, extra = divmod(rows, n)
        start = me * base + min(me, extra)
        expected = reference(inputs, op, prescale, postscale)[start:start + base + (me < extra)]
        failures.append(mismatch(f"reducescatter {rows} rows {dtype} {op.name} x{prescale}", got, expected, dtype, op))
    failures = [f for f in failures if f]
    assert not failures, f"wrong reducescatter results on rank {me}:\n" + "\n".join(failures)
    core.shutdown()


# ----------------------------------------------------------------------------- fusion settings, bits

FUSION_SETTINGS = (
    {"HOROVOD_FUSION_THRESHOLD": "0"},
    {},
    {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024), "HVDTRAIN_CHUNK_BYTES": str(16 * 1024)},
)
FUSION_VARIABLES = ("HOROVOD_FUSION_THRESHOLD", "HVDTRAIN_CHUNK_BYTES")
FUSION_WORKLOAD = [  # (elements, dtype, op, prescale, postscale)
    (elements, dtype, op, prescale, postscale)
    for elements in (0, 1, 3, 100, 1000, 5000, 20000, 70000)
    for dtype in ("float32", "int32", "bfloat16", "float16")
    for op, prescale, postscale in ((ReduceOp.SUM, 1.0, 1.0), (ReduceOp.AVERAGE, 0.5, 2.0))
]


def reduce_workload(n, me):
    """Every tensor of FUSION_WORKLOAD at once (the plain sums as one group, so that they surely
    meet in one cycle); checks each result against NumPy and returns them by index."""
    inputs = [[sample((rank, i), dtype, (elements,)) for rank in range(n)]
              for i, (elements, dtype, *_) in enumerate(FUSION_WORKLOAD)]
    grouped = [i for i, (*_, op, prescale, postscale) in enumerate(FUSION_WORKLOAD) if prescale == postscale == 1.0]
    handles = dict(zip(grouped, core.grouped_allreduce_async([inputs[i][me].copy() for i in grouped],
                                                             name="fused.group", op=ReduceOp.SUM)))
    for i, (elements, dtype, op, prescale, postscale) in enumerate(FUSION_WORKLOAD):
        if i not in handles:
            handles[i] = core.allreduce_async(inputs[i][me].copy(), name=f"fused.{i}", op=op,
                                              prescale_factor=prescale, postscale_factor=postscale)
    results = {i: handle.wait() for i, handle in handles.items()}
    failures = [mismatch(f"tensor {i} ({elements} x {dtype} {op.name} x{prescale} x{postscale})", results[i],
                         reference(inputs[i], op, prescale, postscale), dtype, op)
                for i, (elements, dtype, op, prescale, postscale) in enumerate(FUSION_WORKLOAD)]
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)
    return results


def fused_and_unfused_results_are_identical():
    """The same workload under each FUSION_SETTINGS (re-initializing the engine, which reads
    the environment) gives the same bits. The variables are restored afterwards."""
    before = {variable: os.environ.pop(variable) for variable in FUSION_VARIABLES if variable in os.environ}
    runs = []
    try:
        for settings in FUSION_SETTINGS:
            for variable in FUSION_VARIABLES:
                os.environ.pop(variable, None)
            os.environ.update(settings)
            core.init()
            runs.append(reduce_workload(core.size(), core.rank()))
            core.shutdown()
    finally:
        for variable in FUSION_VARIABLES:
            os.environ.pop(variable, None)
        os.environ.update(before)
    for settings, run in zip(FUSION_SETTINGS[1:], runs[1:]):
        differing = [i for i in run if run[i].tobytes() != runs[0][i].tobytes()]
        assert not differing, f"with {settings} tensors {differing} differ from the unfused run"


def every_rank_gets_the_same_bits_of_an_inexact_reduction():
    """Inexact float inputs, so that the order of additions and where the scaling happens show
    in the last bits: a large Average (scaled piece by piece), a large Sum, a fused Average."""
    core.init()
    n, me = core.size(), core.rank()
    rng = np.random.default_rng(me)
    cases = {"large average": (3 * 1024 * 1024 // 4, ReduceOp.AVERAGE), "large sum": (3 * 1024 * 1024 // 4, ReduceOp.SUM),
             "fused average": (1000, ReduceOp.AVERAGE)}
    for label, (elements, op) in cases.items():
        inputs = rng.standard_normal(elements).astype(np.float32)
        result = core.allreduce_async(inputs.copy(), name=label, op=op).wait()
        everyone = core.allgather_async(result.view(np.uint8)[None], name=f"{label}.bits").wait()
        differing = [r for r in range(n) if everyone[r].tobytes() != everyone[0].tobytes()]
        assert not differing, f"{label}: ranks {differing} got other bits than rank 0"
        every_input = core.allgather_async(inputs[None], name=f"{label}.inputs").wait().astype(np.float64)
        expected = every_input.sum(axis=0) / (n if op == ReduceOp.AVERAGE else 1)
        assert np.allclose(result, expected, rtol=1e-5, atol=1e-5), f"{label}: not the {op.name.lower()}"
    core.shutdown()


# ----------------------------------------------------------------------------- buckets

BUCKET_SHAPES = ((5,), (70000,), (3,), (40, 50), (1,), (300,))
# Elements left out after each tensor: neighbours with no gap are reduced as one region, and
# no region may spill into a gap.
BUCKET_GAPS = (0, 2, 0, 1, 0, 3)
BUCKET_SIZE = sum(math.prod(shape) for shape in BUCKET_SHAPES) + sum(BUCKET_GAPS)


def bucket_regions():
    """(start, stop) of every tensor in the bucket."""
    regions, start = [], 0
    for shape, gap in zip(BUCKET_SHAPES, BUCKET_GAPS):
        regions.append((start, start + math.prod(shape)))
        start += math.prod(shape) + gap
    return regions


def bucket_regions_are_reduced_in_place_exactly_and_gaps_left_alone():
    core.init()
    n, me = core.size(), core.rank()
    rng = np.random.default_rng(me)  # every rank submits in its own order, with its own delays
    regions = bucket_regions()
    steps = (  # (tensors in flight, op, prescale)
        (range(6), ReduceOp.SUM, 1.0),
        ((0, 1, 3, 5), ReduceOp.SUM, 0.5),  # 2 and 4 stay as they are
        ((1, 2, 3), ReduceOp.MAX, 1.0),
        (range(6), ReduceOp.SUM, 1.0),  # the first step again, now from the response cache
    )
    for step, (in_flight, op, prescale) in enumerate(steps):
        inputs = [sample((rank, step), "float32", (BUCKET_SIZE,)) for rank in range(n)]
        flat = inputs[me].copy()
        views = [flat[start:stop].reshape(shape) for (start, stop), shape in zip(regions, BUCKET_SHAPES)]
        handles = {}
        for i in rng.permutation(list(in_flight)):
            handles[i] = core.allreduce_async(views[i], name=f"bucket.{i}", op=op, prescale_factor=prescale,
                                              bucket=("grads", flat))
            if step % 2 == 0:  # the others go out at once, so that neighbours meet in one region
                time.sleep(rng.choice((0, 0, 0.002)))
        assert all(handles[i].wait() is views[i] for i in handles)
        expected = inputs[me].astype(np.float64)
        reduced = reference(inputs, op, prescale)
        for i in in_flight:
            expected[slice(*regions[i])] = reduced[slice(*regions[i])]
        failure = mismatch(f"bucket step {step} (tensors {list(in_flight)})", flat, expected, "float32", op)
        assert failure is None, failure
    core.shutdown()


def a_bucket_layout_that_differs_between_ranks_fails_everywhere_and_leaves_the_data_alone():
    core.init()
    n, me = core.size(), core.rank()
    flat = np.arange(10, dtype=np.float32) + me
    offset = 2 if me == 1 else 0
    with pytest.raises(core.TensorMismatchError) as raised:
        core.allreduce_async(flat[offset:offset + 4], name="bucket.layout", bucket=("other", flat)).wait()
    assert raised.value.field == "bucket layout (bucket, offset)", raised.value
    assert raised.value.values_by_rank == {r: ("other", 2 if r == 1 else 0) for r in range(n)}, raised.value
    assert "rank 1: ('other', 2)" in str(raised.value), raised.value
    bucket = ("other", flat) if me == 0 else None  # in a bucket on rank 0 only
    with pytest.raises(core.TensorMismatchError, match="bucket layout"):
        core.allreduce_async(flat[:4], name="bucket.only_on_0", bucket=bucket).wait()
    assert flat.tolist() == (np.arange(10) + me).tolist()
    assert core.allreduce_async(flat, name="bucket.after", op=ReduceOp.SUM).wait().tolist() == \
        (np.arange(10) * n + n * (n - 1) // 2).tolist()
    core.shutdown()


# ----------------------------------------------------------------------------- Horovod's scaling

# Large: reduced where it lies in 1 MiB pieces; small: packed into the fusion buffer.
SCALING_SHAPES = ((17,), (5, 17), (300_000 // 2 * 2,))
FACTORS = ((1 / 3, 0.7), (0.6180339887, 1 / 7), (2.3, 1.0))  # (prescale, postscale)


def scaled_as_horovod(values, factor, dtype):
    """`values` (float64, exact in `dtype`) scaled as Horovod does, rounded to `dtype`, as float64.
    Horovod multiplies integers in float64, 16-bit floats in float32, others in their own
    precision; the product of two numbers of 24 bits or fewer is exact in float64, so rounding it
    to that precision gives what a multiplication in it gives."""
    compute = np.dtype(np.float64) if dtype.kind in "iu" else np.dtype(np.float32) if dtype.itemsize == 2 else dtype
    product = np.float64(compute.type(factor)) * values
    if dtype.kind in "iu":
        return np.trunc(product)
    return product.astype(compute).astype(dtype).astype(np.float64)


def scaling_input(rank, dtype, shape, salt):
    rng = np.random.default_rng((rank, salt))
    low, high = {"uint8": (0, 20), "int8": (-20, 20), "uint16": (0, 100)}.get(dtype.name, (-100, 100))
    return rng.integers(low, high, shape).astype(np.float64)


def scaling_reference(inputs, dtype, op, prescale, postscale):
    """Sum (or average) of the ranks' scaled inputs; a sum of two values rounded once, as MPI
    rounds it."""
    total = sum(scaled_as_horovod(x, prescale, dtype) for x in inputs)
    if dtype.kind not in "iu":
        total = total.astype(dtype).astype(np.float64)
    return scaled_as_horovod(total, postscale / len(inputs) if op == ReduceOp.AVERAGE else postscale, dtype)


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


def scale_factors_give_horovods_results_for_every_reducible_dtype():
    core.init()
    n, me = core.size(), core.rank()
    failures = []
    for d, dtype in enumerate(map(numpy_dtype, sorted(REDUCIBLE_DTYPES))):
        for (f, (prescale, postscale)), op in zip(enumerate(FACTORS), (ReduceOp.SUM, ReduceOp.AVERAGE) * 2):
            options = dict(op=op, prescale_factor=prescale, postscale_factor=postscale)
            inputs = [[scaling_input(r, dtype, shape, (d, f, s)) for s, shape in enumerate(SCALING_SHAPES)]
                      for r in range(n)]
            expected = [scaling_reference([inputs[r][s] for r in range(n)], dtype, op, prescale, postscale)
                        for s in range(len(SCALING_SHAPES))]
            mine = [x.astype(dtype) for x in inputs[me]]
            label = f"{dtype} {op.name} prescale {prescale:.4g} postscale {postscale:.4g}"

            singles = [core.allreduce_async(x.copy(), name=f"{label} {s}", **options) for s, x in enumerate(mine)]
            grouped = core.grouped_allreduce_async([x.copy() for x in mine], name=f"{label} grouped", **options)
            for form, handles in (("allreduce", singles), ("grouped allreduce", grouped)):
                for s, handle in enumerate(handles):
                    failures.append(difference(f"{form} {label} shape {SCALING_SHAPES[s]}", handle.wait(),
                                               expected[s], dtype))

            # Reducescatter: each rank gets its rows of the same reduction (the first ranks one more).
            scattered = [core.reducescatter_async(mine[0].copy(), name=f"{label} rs", **options)]
            scattered += core.grouped_reducescatter_async([x.copy() for x in mine[1:]], name=f"{label} grouped rs",
                                                          **options)
            for s, handle in enumerate(scattered):
                share = np.array_split(expected[s], n)[me]
                failures.append(difference(f"reducescatter {label} shape {SCALING_SHAPES[s]}", handle.wait(), share,
                                           dtype))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures[:20])
    core.shutdown()


# ----------------------------------------------------------------------------- the jobs

def float16_is_exact_through_an_mpi_without_a_float16_datatype():
    """As an MPI library without Open MPI's MPI_SHORT_FLOAT reduces it (seen on a GPU machine):
    as 16-bit words with a user-defined op."""
    from hvdtrain.core import mpi_backend

    mpi_backend._mpi_has_float16 = lambda MPI: False
    core.init()
    operands, _ = core.running_engine()._host_backend._operands(np.zeros(2, np.float16), ReduceOp.SUM)
    assert isinstance(operands, list), "float16 went to MPI as float16"  # [the words, UINT16_T]
    core.shutdown()
    allreduce_is_exact_for_every_op_scale_dtype_shape_and_form()


EXACT = [allreduce_is_exact_for_every_op_scale_dtype_shape_and_form, reducescatter_is_exact_with_uneven_first_dimensions]
SAME_BITS = [fused_and_unfused_results_are_identical, every_rank_gets_the_same_bits_of_an_inexact_reduction]
BUCKETS = [bucket_regions_are_reduced_in_place_exactly_and_gaps_left_alone,
           a_bucket_layout_that_differs_between_ranks_fails_everywhere_and_leaves_the_data_alone]
SCALING = [scale_factors_give_horovods_results_for_every_reducible_dtype]
# Which checks each job runs: the buckets need not run on 4 ranks, nor Horovod's scaling on more than 2.
WITHOUT_FLOAT16 = [float16_is_exact_through_an_mpi_without_a_float16_datatype]
JOBS = {"alone": EXACT, 2: EXACT + SAME_BITS + BUCKETS + SCALING + WITHOUT_FLOAT16, 3: EXACT + SAME_BITS + BUCKETS,
        4: EXACT + SAME_BITS}


def job(ranks, num_proc):
    if num_proc == "alone":
        return ranks.alone(JOBS["alone"])
    return ranks.run(num_proc, JOBS[num_proc], timeout=420)


@pytest.mark.parametrize("num_proc", ["alone", 2, 3, 4])
@pytest.mark.parametrize("check", EXACT, ids=lambda check: check.__name__)
def test_reductions_are_exact(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("num_proc", [2, 3, 4])
@pytest.mark.parametrize("check", SAME_BITS, ids=lambda check: check.__name__)
def test_results_are_the_same_bits_whatever_the_fusion_and_the_rank(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("check", BUCKETS, ids=lambda check: check.__name__)
def test_buckets(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


def test_scale_factors_give_horovods_results_for_every_reducible_dtype(ranks):
    job(ranks, 2).assert_passed(scale_factors_give_horovods_results_for_every_reducible_dtype)


def test_float16_is_exact_through_an_mpi_without_a_float16_datatype(ranks):
    job(ranks, 2).assert_passed(float16_is_exact_through_an_mpi_without_a_float16_datatype)
