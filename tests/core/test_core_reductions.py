"""Reductions on real ranks give exactly what NumPy computes from every rank's known inputs:
allreduce for every op, scale factor, dtype and shape (in place, into an output, grouped),
reducescatter, tensors in a bucket, and the same bits whatever the fusion settings.

Inputs are small integers (times 1/4 for floats) and scale factors are powers of two, so every
sum, product and scaling is exact in every dtype and results compare bit for bit. One exception:
AVERAGE on a float dtype when the size is not a power of two. The engine multiplies by
postscale/size rounded to the dtype, as Horovod does, so the result may differ from the
correctly rounded quotient by a unit in the last place; those compare within 2 eps relative.
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


def check_allreduce(n, me):
    """Every (op, scale) x dtype x shape, submitted in five ways (in place by default, in place
    through output=input, into an output, grouped in place, grouped into outputs)."""
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


def check_reducescatter(n, me):
    """Uneven first dimensions: the first `rows % n` ranks get one extra row; with n - 1 rows the
    last rank gets none."""
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


def ranks_reductions():
    core.init()
    n, me = core.size(), core.rank()
    check_allreduce(n, me)
    check_reducescatter(n, me)


@pytest.mark.parametrize("num_proc", [2, 3, 4])
def test_reductions_are_exact(mpirun, num_proc):
    mpirun(num_proc, ranks_reductions, timeout=180)


def test_reductions_alone(alone):
    alone(ranks_reductions)


# ----------------------------------------------------------------------------- fusion settings

FUSION_SETTINGS = (
    {"HOROVOD_FUSION_THRESHOLD": "0"},
    {},
    {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024), "HVDTRAIN_CHUNK_BYTES": str(16 * 1024)},
)
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


def ranks_fusion_settings_agree():
    """The same workload under each FUSION_SETTINGS (re-initializing the engine, which reads
    the environment) gives the same bits."""
    runs = []
    for settings in FUSION_SETTINGS:
        for variable in ("HOROVOD_FUSION_THRESHOLD", "HVDTRAIN_CHUNK_BYTES"):
            os.environ.pop(variable, None)
        os.environ.update(settings)
        core.init()
        runs.append(reduce_workload(core.size(), core.rank()))
        core.shutdown()
    for settings, run in zip(FUSION_SETTINGS[1:], runs[1:]):
        differing = [i for i in run if run[i].tobytes() != runs[0][i].tobytes()]
        assert not differing, f"with {settings} tensors {differing} differ from the unfused run"


@pytest.mark.parametrize("num_proc", [2, 3, 4])
def test_fused_and_unfused_results_are_identical(mpirun, num_proc):
    mpirun(num_proc, ranks_fusion_settings_agree, timeout=180)


def ranks_get_the_same_bits():
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


@pytest.mark.parametrize("num_proc", [2, 3, 4])
def test_every_rank_gets_the_same_bits(mpirun, num_proc):
    mpirun(num_proc, ranks_get_the_same_bits)


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


def ranks_bucket():
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

    if n > 1:
        check_bucket_mismatch(n, me)


def check_bucket_mismatch(n, me):
    """A layout that differs between ranks fails on every rank and leaves the data alone."""
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


def ranks_bucket_misuse():
    core.init()
    flat = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="does not lie inside bucket 'b'"):
        core.allreduce_async(np.zeros(3, np.float32), name="outside", bucket=("b", flat))
    with pytest.raises(ValueError, match="reduced in place"):
        core.allreduce_async(flat[:3], name="out_of_place", output=np.zeros(3, np.float32), bucket=("b", flat))
    with pytest.raises(ValueError, match="bucket 'b' holds float64, not float32"):
        core.allreduce_async(flat[:3], name="wrong_dtype", bucket=("b", np.zeros(10, np.float64)))


def test_bucket_misuse_is_refused_at_submission(alone):
    alone(ranks_bucket_misuse)


@pytest.mark.parametrize("num_proc", [2, 3])
def test_bucket_regions_are_exact(mpirun, num_proc):
    mpirun(num_proc, ranks_bucket, timeout=120)


# ----------------------------------------------------------------------------- resubmission

def ranks_resubmitted():
    """Training submits the same array objects under the same names every step, and the engine
    skips validating them again. Whatever changes between steps (the values, the op, the
    array's shape, its bucket, its writeability) must still be seen."""
    core.init()
    n, me = core.size(), core.rank()
    flat = np.zeros(BUCKET_SIZE, np.float32)
    regions = bucket_regions()
    views = [flat[start:stop].reshape(shape) for (start, stop), shape in zip(regions, BUCKET_SHAPES)]

    def step(label, op, shapes=BUCKET_SHAPES):
        inputs = [sample((rank, label), "float32", (BUCKET_SIZE,)) for rank in range(n)]
        flat[:] = inputs[me]
        handles = [core.allreduce_async(view, name=f"resubmitted.{i}", op=op, bucket=("grads", flat))
                   for i, view in enumerate(views)]
        assert all(h.wait() is view for h, view in zip(handles, views))
        for view, shape in zip(views, shapes):
            assert view.shape == shape
        expected = inputs[me].astype(np.float64)
        reduced = reference(inputs, op)
        for start, stop in regions:
            expected[start:stop] = reduced[start:stop]
        failure = mismatch(f"step {label}", flat, expected, "float32", op)
        assert failure is None, failure

    for label in range(3):
        step(label, ReduceOp.SUM)
    step(10, ReduceOp.MAX)
    views[3].shape = (50, 40)  # the same array object, reshaped in place
    step(11, ReduceOp.SUM, BUCKET_SHAPES[:3] + ((50, 40),) + BUCKET_SHAPES[4:])
    if n > 1:
        if me == 1:
            views[3].shape = (40, 50)
        with pytest.raises(core.TensorMismatchError) as raised:
            core.allreduce_async(views[3], name="resubmitted.3", op=ReduceOp.SUM, bucket=("grads", flat)).wait()
        assert raised.value.field == "shape", raised.value

    other = np.zeros(BUCKET_SIZE, np.float32)
    with pytest.raises(ValueError, match="does not lie inside bucket 'grads'"):
        core.allreduce_async(views[0], name="resubmitted.0", op=ReduceOp.SUM, bucket=("grads", other))
    views[1].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        core.allreduce_async(views[1], name="resubmitted.1", op=ReduceOp.SUM, bucket=("grads", flat))


def test_resubmitted_arrays_alone(alone):
    alone(ranks_resubmitted)


@pytest.mark.parametrize("num_proc", [2, 3])
def test_resubmitted_arrays_are_exact(mpirun, num_proc):
    mpirun(num_proc, ranks_resubmitted, timeout=120)
