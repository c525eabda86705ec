"""The core's device backends (hvdtrain/core/backend.py: NCCL, and MPI through pinned host memory)
on real ranks, on a stand-in for CuPy whose device memory is host memory (fake_cupy/README.md):
exact results of every collective on "device" buffers at 1, 2 and 3 ranks on NCCL and at 2 and 3
on MPI, fused, in a bucket, ragged, uneven, with a rank that joined; the refusal of ranks that
share a GPU on NCCL; the same name on a GPU here and in host memory there. What only a real GPU
shows (stream ordering, CuPy's and NCCL's own behaviour) is in tests/gpu/."""

import numpy as np
import pytest
from support.devices import fake_gpus

from hvdtrain import core

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8"]


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _data(rank, shape, dtype, salt=0):
    """Small integers: sums, products and averages of n times them are exact in every dtype."""
    count = int(np.prod(shape))
    return ((np.arange(count) + rank + salt) % 5 + 1).reshape(shape).astype(dtype)


def _same(got, expected, what):
    host = got.get()
    assert host.dtype == expected.dtype and host.shape == expected.shape, (what, host.dtype, host.shape)
    assert np.array_equal(host.astype(np.float64), expected.astype(np.float64)), f"{what}: {host} != {expected}"


def device_allreduce_is_exact_for_every_op_dtype_and_shape(transport):
    with fake_gpus(transport) as cupy:
        Op = core.ReduceOp
        n, r = core.size(), core.rank()
        for name in DTYPES:
            dtype = _dtype(name)
            for shape in [(), (7,), (3, 4, 5), (0, 2)]:
                what = f"{name} {shape}"
                inputs = [_data(k, shape, dtype) for k in range(n)]
                wide = np.stack([a.astype(np.float64) for a in inputs])
                for op, expected in [(Op.SUM, wide.sum(0)), (Op.MIN, wide.min(0)), (Op.MAX, wide.max(0)),
                                     (Op.PRODUCT, wide.prod(0))]:
                    array = cupy.asarray(inputs[r])
                    core.allreduce_async(array, name=f"{op.name} {what}", op=op).wait()
                    _same(array, expected.astype(dtype), f"{op.name} {what}")


def device_average_with_scale_factors_into_an_output_is_exact(transport):
    with fake_gpus(transport) as cupy:
        n, r = core.size(), core.rank()
        for name in DTYPES:
            dtype = _dtype(name)
            if dtype.kind not in "fV":
                continue
            for shape in [(), (7,), (3, 4, 5), (0, 2)]:
                inputs = [_data(k, shape, dtype) for k in range(n)]
                wide = np.stack([a.astype(np.float64) for a in inputs])
                out = cupy.empty(shape, dtype)
                core.allreduce_async(cupy.asarray(inputs[r] * n), name=f"avg {name} {shape}", op=core.ReduceOp.AVERAGE,
                                     output=out, prescale_factor=2.0, postscale_factor=0.5).wait()
                _same(out, wide.sum(0).astype(dtype), f"average {name} {shape}")


def a_device_bucket_is_reduced_in_place_beside_a_loose_tensor(transport):
    """Views of one flat array reduced in place as regions."""
    with fake_gpus(transport) as cupy:
        n, r = core.size(), core.rank()
        for name in DTYPES:
            dtype = _dtype(name)
            flat = cupy.asarray(np.concatenate([_data(r, (k + 3,), dtype, k) for k in range(6)]))
            offsets = np.cumsum([0] + [k + 3 for k in range(6)])
            handles = [core.allreduce_async(flat[offsets[k]:offsets[k + 1]], name=f"bucket.{name}.{k}",
                                            op=core.ReduceOp.SUM, bucket=(f"bucket.{name}", flat)) for k in range(6)]
            loose = cupy.asarray(_data(r, (5,), dtype))
            handles.append(core.allreduce_async(loose, name=f"loose.{name}", op=core.ReduceOp.SUM))
            for handle in handles:
                handle.wait()
            _same(flat, sum(np.concatenate([_data(q, (k + 3,), dtype, k) for k in range(6)]).astype(np.float64)
                            for q in range(n)).astype(dtype), f"bucket {name}")
            _same(loose, sum(_data(q, (5,), dtype).astype(np.float64) for q in range(n)).astype(dtype),
                  f"loose {name}")


def device_allgather_concatenates_rows_that_differ_by_rank_or_not(transport):
    with fake_gpus(transport) as cupy:
        n, r = core.size(), core.rank()
        for name in DTYPES:
            dtype = _dtype(name)
            for rows_of in (lambda k: k + 1, lambda k: 2):
                gathered = core.allgather_async(cupy.asarray(_data(r, (rows_of(r), 3), dtype)),
                                                name=f"ag.{name}.{rows_of(0)}")
                _same(gathered.wait(), np.concatenate([_data(k, (rows_of(k), 3), dtype) for k in range(n)]),
                      f"allgather {name}")


def device_broadcast_gives_every_rank_the_roots_values(transport):
    with fake_gpus(transport) as cupy:
        n, r = core.size(), core.rank()
        for name in DTYPES:
            dtype = _dtype(name)
            value = cupy.asarray(_data(r, (4, 2), dtype))
            core.broadcast_async(value, n - 1, name=f"bcast.{name}").wait()
            _same(value, _data(n - 1, (4, 2), dtype), f"broadcast {name}")


def device_alltoall_sends_each_rank_its_rows(transport):
    """Rank r sends k + 1 rows to rank k."""
    with fake_gpus(transport) as cupy:
        n, r = core.size(), core.rank()
        for name in DTYPES:
            dtype = _dtype(name)
            sent = cupy.asarray(np.concatenate([_data(10 * r + k, (k + 1, 2), dtype) for k in range(n)]))
            received, splits = core.alltoall_async(sent, splits=[k + 1 for k in range(n)], name=f"a2a.{name}").wait()
            _same(received, np.concatenate([_data(10 * k + r, (r + 1, 2), dtype) for k in range(n)]),
                  f"alltoall {name}")
            assert splits.tolist() == [r + 1] * n, splits


def device_reducescatter_is_exact_for_rows_that_divide_or_not(transport):
    """Sum, and Average with scaling."""
    with fake_gpus(transport) as cupy:
        Op = core.ReduceOp
        n, r = core.size(), core.rank()
        for name in DTYPES:
            dtype = _dtype(name)
            for first_dim in (2 * n, 2 * n + 1):
                blocks = [_data(k, (first_dim, 3), dtype) for k in range(n)]
                total = np.stack([b.astype(np.float64) for b in blocks]).sum(0)
                start = sum(first_dim // n + (k < first_dim % n) for k in range(r))
                rows = first_dim // n + (r < first_dim % n)
                share = core.reducescatter_async(cupy.asarray(blocks[r]), name=f"rs.{name}.{first_dim}",
                                                 op=Op.SUM).wait()
                _same(share, total[start:start + rows].astype(dtype), f"reducescatter {name} {first_dim}")
                if dtype.kind in "fV":
                    share = core.reducescatter_async(cupy.asarray(blocks[r] * n), name=f"rsa.{name}.{first_dim}",
                                                     op=Op.AVERAGE, prescale_factor=0.5, postscale_factor=2.0).wait()
                    _same(share, total[start:start + rows].astype(dtype), f"reducescatter average {name} {first_dim}")


def many_small_device_tensors_are_packed_and_unpacked_exactly(transport):
    """Many small tensors in flight at once: packed into the fusion buffer, unpacked by the
    batched copy."""
    with fake_gpus(transport) as cupy:
        n, r = core.size(), core.rank()
        handles = [(k, core.allreduce_async(cupy.asarray(_data(r, (k % 7 + 1, 3), np.float32, k)), name=f"small.{k}",
                                            op=core.ReduceOp.SUM)) for k in range(100)]
        for k, handle in handles:
            expected = sum(_data(q, (k % 7 + 1, 3), np.float32, k) for q in range(n))
            _same(handle.wait(), expected, f"small tensor {k}")


def device_allreduces_beside_a_rank_that_joined_get_zeros_from_it(transport):
    """The last rank joins at once; the others' allreduces go on, with zeros from it."""
    with fake_gpus(transport) as cupy:
        n, r = core.size(), core.rank()
        if r == n - 1:
            last = core.join()
        else:
            for step in range(3):
                array = cupy.asarray(np.full(6, r + 1, np.float32))
                core.allreduce_async(array, name=f"joined.{step}", op=core.ReduceOp.SUM).wait()
                _same(array, np.full(6, n * (n - 1) / 2, np.float32), f"allreduce beside a joined rank, step {step}")
            last = core.join()
        assert last == n - 1 if n == 1 else last < n - 1, last  # it joined first, so one of the others was last


DEVICE_COLLECTIVES = [device_allreduce_is_exact_for_every_op_dtype_and_shape,
                      device_average_with_scale_factors_into_an_output_is_exact,
                      a_device_bucket_is_reduced_in_place_beside_a_loose_tensor,
                      device_allgather_concatenates_rows_that_differ_by_rank_or_not,
                      device_broadcast_gives_every_rank_the_roots_values,
                      device_alltoall_sends_each_rank_its_rows,
                      device_reducescatter_is_exact_for_rows_that_divide_or_not,
                      many_small_device_tensors_are_packed_and_unpacked_exactly,
                      device_allreduces_beside_a_rank_that_joined_get_zeros_from_it]


# ----------------------------------------------------------------------------- refusals on NCCL


def ranks_sharing_a_gpu_are_refused_on_every_rank_naming_the_way_out(transport):
    """NCCL (`transport`) needs one GPU per rank; the engine goes on with host collectives."""
    with fake_gpus(transport, shared=True) as cupy:
        r = core.rank()
        try:
            core.allreduce_async(cupy.asarray(np.ones(3, np.float32)), name="shared").wait()
        except core.HorovodInternalError as error:
            message = str(error)
            assert "NCCL needs one GPU per rank, but ranks 0, 1, 2 on" in message, message
            assert "HOROVOD_GPU_OPERATIONS=MPI" in message, message
        else:
            raise AssertionError(f"rank {r}: NCCL started on a shared GPU")
        assert core.allreduce_async(np.ones(2), name="after", op=core.ReduceOp.SUM).wait().tolist() == [3.0, 3.0]


def one_name_on_a_gpu_and_in_host_memory_fails_on_every_rank(transport):
    with fake_gpus(transport) as cupy:
        r = core.rank()
        array = cupy.asarray(np.ones(4, np.float32)) if r == 1 else np.ones(4, np.float32)
        try:
            core.allreduce_async(array, name="where").wait()
        except core.TensorMismatchError as error:
            assert "Mismatched device for collective 'where'" in str(error), error
            assert "rank 1: cuda" in str(error) and "ranks 0, 2: cpu" in str(error), error
        else:
            raise AssertionError(f"rank {r}: a tensor on a GPU and in host memory were reduced together")


ON_THREE_NCCL_RANKS = [ranks_sharing_a_gpu_are_refused_on_every_rank_naming_the_way_out,
                       one_name_on_a_gpu_and_in_host_memory_fails_on_every_rank]


def job(ranks, transport, num_proc):
    checks = DEVICE_COLLECTIVES + (ON_THREE_NCCL_RANKS if (transport, num_proc) == ("NCCL", 3) else [])
    return ranks.run(num_proc, checks, transport, timeout=300)


@pytest.mark.parametrize("transport, num_proc", [("NCCL", 1), ("NCCL", 2), ("NCCL", 3), ("MPI", 2), ("MPI", 3)])
@pytest.mark.parametrize("check", DEVICE_COLLECTIVES, ids=lambda check: check.__name__)
def test_device_collectives_are_exact(ranks, check, transport, num_proc):
    job(ranks, transport, num_proc).assert_passed(check)


@pytest.mark.parametrize("check", ON_THREE_NCCL_RANKS, ids=lambda check: check.__name__)
def test_nccl_refuses_what_it_cannot_run_on_every_rank(ranks, check):
    job(ranks, "NCCL", 3).assert_passed(check)
