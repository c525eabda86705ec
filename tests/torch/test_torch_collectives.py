"""hvdtrain.torch collectives: exact results, Horovod's gradients, join, errors, SyncBatchNorm."""

import warnings

import pytest
import torch

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]


def _check_allreduce(hvd, n, r):
    for dtype in DTYPES:
        for shape in [(), (5,), (3, 4), (2, 3, 4)]:
            x = torch.full(shape, r + 1, dtype=dtype)
            total = n * (n + 1) // 2
            assert torch.equal(hvd.allreduce(x, op=hvd.Sum), torch.full(shape, total, dtype=dtype)), (dtype, shape)
            assert torch.equal(hvd.allreduce(x, op=hvd.Min), torch.full(shape, 1, dtype=dtype))
            assert torch.equal(hvd.allreduce(x, op=hvd.Max), torch.full(shape, n, dtype=dtype))
            if dtype.is_floating_point:
                averaged = hvd.allreduce(x * 2)  # the default op is Average
                assert torch.equal(averaged, torch.full(shape, n + 1, dtype=dtype)), (dtype, shape)
    x = torch.full((4,), 2.0, dtype=torch.float64)
    assert torch.equal(hvd.allreduce(x, op=hvd.Product), torch.full((4,), 2.0 ** n, dtype=torch.float64))
    scaled = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert torch.equal(scaled, torch.full((4,), 3.0 * n, dtype=torch.float64))
    # The input is untouched by allreduce; allreduce_ works in place; async forms poll.
    y = torch.full((6,), float(r), dtype=torch.float32)
    hvd.allreduce(y, op=hvd.Sum)
    assert torch.equal(y, torch.full((6,), float(r)))
    handle = hvd.allreduce_async_(y, op=hvd.Sum, name="in_place")
    out = hvd.synchronize(handle)
    assert out is y and torch.equal(y, torch.full((6,), float(n * (n - 1) // 2)))
    handle = hvd.allreduce_async(torch.ones(3), name="polled")
    while not hvd.poll(handle):
        pass
    assert torch.equal(hvd.synchronize(handle), torch.ones(3))
    # Non-contiguous input is fine out of place, refused in place.
    t = torch.arange(12.0).reshape(3, 4).t()
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), t * n)
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_(t)
    # The deprecated `average` argument.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(hvd.allreduce(torch.ones(2), average=False), torch.full((2,), float(n)))
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)
    # fp16 compression keeps the dtype and the (exactly representable) values.
    compressed = hvd.allreduce(torch.full((5,), 0.25 * (r + 1)), op=hvd.Sum, compression=hvd.Compression.fp16)
    assert compressed.dtype == torch.float32 and torch.equal(compressed, torch.full((5,), 0.25 * n * (n + 1) / 2))
    grouped = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3, dtype=torch.int64) * r], op=hvd.Sum)
    assert torch.equal(grouped[0], torch.ones(2) * (n * (n - 1) // 2))
    assert torch.equal(grouped[1], torch.ones(3, dtype=torch.int64) * (n * (n - 1) // 2))


def _check_other_collectives(hvd, n, r):
    gathered = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int32))
    expected = torch.cat([torch.full((k + 1, 2), k, dtype=torch.int32) for k in range(n)])
    assert torch.equal(gathered, expected)
    for root in range(n):
        value = torch.full((3, 2), float(r))
        assert torch.equal(hvd.broadcast(value, root), torch.full((3, 2), float(root)))
        assert torch.equal(value, torch.full((3, 2), float(r))), "broadcast modified its input"
        hvd.broadcast_(value, root)
        assert torch.equal(value, torch.full((3, 2), float(root)))
    # Rank r sends k+r rows to rank k (some are empty).
    splits = [k + r for k in range(n)] if r else [0] * (n - 1) + [1]
    rows = torch.arange(sum(splits), dtype=torch.float32).unsqueeze(1) + 100 * r
    received, received_splits = hvd.alltoall(rows, splits=torch.tensor(splits, dtype=torch.int32))
    expected_splits = [(r + k if k else (1 if r == n - 1 else 0)) for k in range(n)]
    assert received_splits.tolist() == expected_splits
    parts = []
    for k in range(n):
        their_splits = [j + k for j in range(n)] if k else [0] * (n - 1) + [1]
        start = sum(their_splits[:r])
        parts.append(torch.arange(start, start + their_splits[r], dtype=torch.float32).unsqueeze(1) + 100 * k)
    assert torch.equal(received, torch.cat(parts))
    # Reducescatter of 2n+1 rows: the first rank gets one extra row.
    x = torch.arange(2 * n + 1, dtype=torch.float64).unsqueeze(1) * (r + 1)
    mine = hvd.reducescatter(x, op=hvd.Sum)
    start = 2 * r + min(r, 1)
    rows_here = 3 if r == 0 else 2
    assert torch.equal(mine, torch.arange(start, start + rows_here, dtype=torch.float64).unsqueeze(1) * n * (n + 1) / 2)
    assert hvd.broadcast_object({"from": r}, root_rank=n - 1) == {"from": n - 1}
    assert hvd.allgather_object(("rank", r)) == [("rank", k) for k in range(n)]


def _check_gradients(hvd, n, r):
    x = torch.ones(4, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).backward(torch.ones(4))
    assert torch.equal(x.grad, torch.full((4,), float(n)))
    x = torch.ones(4, requires_grad=True)
    hvd.allreduce(x).backward(torch.ones(4))
    assert torch.equal(x.grad, torch.ones(4))
    # Allgather: the gradient of this rank's rows is the average over ranks of their gradients.
    x = torch.ones(r + 1, 3, requires_grad=True)
    gathered = hvd.allgather(x)
    weights = torch.cat([torch.full((k + 1, 3), float(k)) for k in range(n)])
    gathered.backward(weights)
    assert torch.equal(x.grad, torch.full((r + 1, 3), float(r)))
    # Broadcast: the root gets the averaged gradient, the others zero.
    root = n - 1
    x = torch.ones(2, requires_grad=True)
    hvd.broadcast(x, root).backward(torch.ones(2))
    assert torch.equal(x.grad, torch.ones(2) * (1.0 if r == root else 0.0))
    # Reducescatter (Sum): every rank's input gets the gathered output gradients times the
    # size, as Horovod 0.28 defines it.
    x = torch.ones(2 * n, 1, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum).backward(torch.full((2, 1), float(r)))
    assert torch.equal(x.grad, torch.cat([torch.full((2, 1), float(k * n)) for k in range(n)]))
    # Alltoall: gradients travel back to where the rows came from.
    x = torch.ones(n, 1, requires_grad=True)
    received = hvd.alltoall(x)
    received.backward(torch.arange(n, dtype=torch.float32).unsqueeze(1) + 10 * r)
    assert torch.equal(x.grad, torch.tensor([[float(r + 10 * k)] for k in range(n)]))


def _check_grouped_allgather_and_reducescatter(hvd, n, r):
    """The grouped forms give each member the result of its single form, in order, with
    gradients like theirs; the members differ in rows, dtype and shape."""
    a = torch.full((r + 1, 2), r, dtype=torch.int32)
    b = torch.arange(2 * (n - r), dtype=torch.float64).reshape(n - r, 2, 1) + r
    ga, gb = hvd.grouped_allgather([a, b], name="grouped.gather")
    assert torch.equal(ga, torch.cat([torch.full((k + 1, 2), k, dtype=torch.int32) for k in range(n)]))
    assert torch.equal(gb, torch.cat([torch.arange(2 * (n - k), dtype=torch.float64).reshape(n - k, 2, 1) + k
                                      for k in range(n)]))
    handle = hvd.grouped_allgather_async([a], name="grouped.gather.async")
    assert torch.equal(hvd.synchronize(handle)[0], ga)

    x = torch.arange(2 * n + 1, dtype=torch.float64).unsqueeze(1) * (r + 1)
    y = torch.ones(n, 3, dtype=torch.float32) * (r + 1)
    sx, sy = hvd.grouped_reducescatter([x, y], op=hvd.Sum, postscale_factor=2.0)
    start, rows_here = 2 * r + min(r, 1), 3 if r == 0 else 2
    total = n * (n + 1) / 2
    assert torch.equal(sx, torch.arange(start, start + rows_here, dtype=torch.float64).unsqueeze(1) * total * 2)
    assert torch.equal(sy, torch.full((1, 3), total * 2, dtype=torch.float32))
    averaged = hvd.synchronize(hvd.grouped_reducescatter_async([y], name="grouped.rs.async"))[0]
    assert torch.allclose(averaged, torch.full((1, 3), total / n))

    # Gradients: allgather's as in _check_gradients, member by member.
    xa = torch.ones(r + 1, 3, requires_grad=True)
    xb = torch.ones(2, requires_grad=True)
    out_a, out_b = hvd.grouped_allgather([xa, xb])
    torch.autograd.backward([out_a, out_b], [torch.cat([torch.full((k + 1, 3), float(k)) for k in range(n)]),
                                             torch.arange(2.0 * n)])
    assert torch.equal(xa.grad, torch.full((r + 1, 3), float(r)))
    assert torch.equal(xb.grad, torch.tensor([2.0 * r, 2.0 * r + 1]))
    # Reducescatter with Average: the gathered output gradients, as Horovod 0.28 defines it.
    xs = [torch.ones(2 * n, 1, requires_grad=True), torch.ones(n, requires_grad=True)]
    outs = hvd.grouped_reducescatter(xs, op=hvd.Average)
    torch.autograd.backward(outs, [torch.full((2, 1), float(r)), torch.full((1,), float(r))])
    assert torch.equal(xs[0].grad, torch.cat([torch.full((2, 1), float(k)) for k in range(n)]))
    assert torch.equal(xs[1].grad, torch.tensor([float(k) for k in range(n)]))


def _check_join_and_errors(hvd, n, r):
    # Rank 0 runs out of data first; the others keep averaging with zeros from it.
    for step in range(r):
        averaged = hvd.allreduce(torch.full((3,), 1.0), name=f"join.step.{step}")
        contributors = sum(1 for k in range(n) if k > step)
        assert torch.equal(averaged, torch.full((3,), contributors / n)), (step, averaged)
    assert hvd.join() == n - 1
    # The same name with different shapes on different ranks: an error on every rank.
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched shape.*rank"):
        hvd.allreduce(torch.ones(r + 1), name="disagreeing.shape")
    # ... after which the engine keeps working.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def ranks_collectives():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    _check_allreduce(hvd, n, r)
    _check_other_collectives(hvd, n, r)
    _check_gradients(hvd, n, r)
    _check_grouped_allgather_and_reducescatter(hvd, n, r)
    _check_join_and_errors(hvd, n, r)
    hvd.barrier()


@pytest.mark.parametrize("num_proc", [2, 3])
def test_collectives(mpirun, num_proc):
    mpirun(num_proc, ranks_collectives, timeout=180)


def ranks_sync_batch_norm():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4 * n, 3, 5, 5, generator=generator, dtype=torch.float64) * 3 + 1
    upstream = torch.randn(4 * n, 3, 5, 5, generator=generator, dtype=torch.float64)

    reference = torch.nn.BatchNorm2d(3).double()
    reference.weight.data.uniform_(0.5, 1.5, generator=generator)
    reference.bias.data.uniform_(-1, 1, generator=generator)
    sync = hvd.SyncBatchNorm(3).double()
    sync.load_state_dict(reference.state_dict())

    whole = x.clone().requires_grad_()
    (reference(whole) * upstream).sum().backward()
    mine = x[4 * r:4 * (r + 1)].clone().requires_grad_()
    out = sync(mine)
    (out * upstream[4 * r:4 * (r + 1)]).sum().backward()

    expected_out = torch.nn.functional.batch_norm(x, None, None, reference.weight, reference.bias, True, 0.0, 1e-5)
    assert torch.allclose(out, expected_out[4 * r:4 * (r + 1)], atol=1e-12)
    assert torch.allclose(sync.running_mean, reference.running_mean, atol=1e-12)
    assert torch.allclose(sync.running_var, reference.running_var, atol=1e-12)
    assert torch.allclose(mine.grad, whole.grad[4 * r:4 * (r + 1)], atol=1e-10)
    # Parameter gradients are this rank's share; their sum over ranks is the whole batch's.
    assert torch.allclose(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad, atol=1e-10)
    assert torch.allclose(hvd.allreduce(sync.bias.grad, op=hvd.Sum), reference.bias.grad, atol=1e-10)
    # In evaluation it normalizes with the running statistics, locally.
    sync.eval()
    reference.eval()
    assert torch.allclose(sync(mine.detach()), reference(mine.detach()), atol=1e-12)


def test_sync_batch_norm_matches_batch_norm_over_all_ranks(mpirun):
    mpirun(3, ranks_sync_batch_norm, timeout=120)
