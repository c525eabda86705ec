"""Collectives on CUDA tensors through hvdtrain.torch: exact results for every operation,
several dtypes and shapes, fused and unfused; at world size 1 through NCCL, and at 2 and 3
ranks sharing one GPU both through host memory and through NCCL, the ranks joined as hosts of
their own (gpu/support.py). And the ordering of GPU work: a tensor
written by a kernel on the caller's stream right before it is submitted is reduced with its
final values, with no host synchronisation in between. Adasum of CUDA tensors, through host
memory, and the Adasum DistributedOptimizer on a GPU model."""

import pytest
import torch

from gpu.support import SHARED_GPU, gpu_of_local_rank
from support.adasum import adasum_reference


FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTEGERS = [torch.uint8, torch.int32, torch.int64]


def _data(rank, shape, dtype, device, salt=0):
    """Small integers, so that sums, products and averages over 3 ranks are exact in every dtype
    (averages: multiples of the world size)."""
    values = (torch.arange(max(1, torch.Size(shape).numel()), dtype=torch.float64) + rank + salt) % 5 + 1
    return values[:torch.Size(shape).numel()].reshape(shape).to(dtype).to(device)


def _check(got, expected, what):
    assert got.device.type == "cuda", f"{what}: the result is on {got.device}"
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, got.shape, expected.shape)
    assert torch.equal(got.cpu(), expected.cpu()), f"{what}: {got.cpu()} != {expected.cpu()}"


def ranks_collectives():
    import hvdtrain.torch as hvd

    hvd.init()
    device, n, r = gpu_of_local_rank(hvd), hvd.size(), hvd.rank()
    everyone = range(n)
    for dtype in FLOATS + INTEGERS:
        for shape in [(), (7,), (3, 4, 5), (0, 3)]:
            what = f"{dtype} {shape}"
            inputs = [_data(k, shape, dtype, device) for k in everyone]
            mine = inputs[r]
            stacked = torch.stack([t.double() for t in inputs])
            _check(hvd.allreduce(mine, op=hvd.Sum, name=f"sum {what}"), stacked.sum(0).to(dtype), f"sum {what}")
            _check(hvd.allreduce(mine, op=hvd.Max, name=f"max {what}"), stacked.amax(0).to(dtype), f"max {what}")
            _check(hvd.allreduce(mine, op=hvd.Min, name=f"min {what}"), stacked.amin(0).to(dtype), f"min {what}")
            _check(hvd.allreduce(mine, op=hvd.Product, name=f"prod {what}"), stacked.prod(0).to(dtype),
                   f"prod {what}")
            if dtype in FLOATS:  # integer averages truncate, as Horovod's do
                _check(hvd.allreduce(mine * n, op=hvd.Average, name=f"avg {what}"), stacked.sum(0).to(dtype),
                       f"average {what}")  # the average of n times the inputs is their sum, exactly
                _check(hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                                     name=f"scaled {what}"), stacked.sum(0).to(dtype), f"scaled {what}")
            in_place = mine.clone()
            hvd.allreduce_(in_place, op=hvd.Sum, name=f"in place {what}")
            _check(in_place, stacked.sum(0).to(dtype), f"in place {what}")

        # Allgather with rows that differ per rank, and broadcast from the last rank.
        rows = [_data(k, (k + 1, 3), dtype, device, salt=1) for k in everyone]
        _check(hvd.allgather(rows[r], name=f"gather {dtype}"), torch.cat(rows), f"allgather {dtype}")
        _check(hvd.broadcast(rows[r][:1], root_rank=n - 1, name=f"bcast {dtype}"), rows[n - 1][:1],
               f"broadcast {dtype}")
        # Alltoall: rank r sends k + 1 rows to rank k.
        sent = torch.cat([_data(r * 10 + k, (k + 1, 2), dtype, device) for k in everyone])
        received, splits = hvd.alltoall(sent, splits=[k + 1 for k in everyone], name=f"a2a {dtype}")
        _check(received, torch.cat([_data(k * 10 + r, (r + 1, 2), dtype, device) for k in everyone]),
               f"alltoall {dtype}")
        assert splits.tolist() == [r + 1] * n, splits
        # Reducescatter, with rows that divide and rows that do not.
        for first_dim in (2 * n, 2 * n + 1):
            block = [_data(k, (first_dim, 3), dtype, device) for k in everyone]
            total = torch.stack([b.double() for b in block]).sum(0).to(dtype)
            start = sum(first_dim // n + (1 if k < first_dim % n else 0) for k in range(r))
            share = first_dim // n + (1 if r < first_dim % n else 0)
            _check(hvd.reducescatter(block[r], op=hvd.Sum, name=f"rs {dtype} {first_dim}"),
                   total[start:start + share], f"reducescatter {dtype} {first_dim}")

    # Fused: many small tensors in flight at once, and a group (one fusion buffer, batched copies).
    handles = [hvd.allreduce_async(_data(r, (k + 1,), torch.float32, device, salt=k), op=hvd.Sum, name=f"f{k}")
               for k in range(64)]
    for k, handle in enumerate(handles):
        expected = torch.stack([_data(q, (k + 1,), torch.float32, device, salt=k) for q in everyone]).sum(0)
        _check(hvd.synchronize(handle), expected, f"fused f{k}")
    group = [_data(r, (k + 2, 2), torch.float64, device, salt=k) for k in range(20)]
    for k, got in enumerate(hvd.grouped_allreduce(group, op=hvd.Sum, name="group")):
        _check(got, torch.stack([_data(q, (k + 2, 2), torch.float64, device, salt=k) for q in everyone]).sum(0),
               f"group member {k}")
    hvd.barrier()
    assert hvd.join() in everyone
    print(f"rank {r} collectives ok")


def ranks_ordering():
    """The engine's stream must wait for the caller's: `x` is written after a long kernel."""
    import hvdtrain.torch as hvd

    hvd.init()
    device, n, r = gpu_of_local_rank(hvd), hvd.size(), hvd.rank()
    for attempt in range(3):
        x = torch.zeros(1 << 22, device=device)
        torch.cuda._sleep(200_000_000)  # keeps the current stream busy for a while (~0.1 s)
        x.fill_(r + 1)
        out = hvd.allreduce(x, op=hvd.Sum, name=f"ordered.{attempt}")  # out of place, no host sync
        total = out.sum()  # on the current stream, which synchronize() made wait for the engine
        assert total.item() == x.numel() * n * (n + 1) / 2, f"rank {r}: reduced before the stream wrote x"
    print(f"rank {r} ordering ok")


def caller_cuda_state_kept():
    """At world size 1 a caller blocked on a result runs the engine's cycle on its own thread
    (Engine.hurry), whose device backend sets the CUDA device and CuPy's current stream for its
    own stream: the caller's must stay as they were, and the result right."""
    import cupy

    from hvdtrain import core

    core.init()
    cupy.cuda.Device(0).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        array = cupy.ones(4, cupy.float32)
        for name in ("first", "second", "third"):  # the first makes the device backend
            core.allreduce_async(array, op=core.ReduceOp.SUM, name=name).wait()
            assert cupy.cuda.get_current_stream().ptr == stream.ptr, f"{name}: CuPy's current stream changed"
            assert cupy.cuda.runtime.getDevice() == 0, f"{name}: the current device changed"
        assert array.get().tolist() == [1.0] * 4
    core.shutdown()
    print("rank 0 cuda state ok")


def ranks_adasum():
    """Adasum of CUDA tensors goes through host memory: over all ranks where the allreduce runs on
    MPI, averaged within the host (all ranks here) where it runs on NCCL, as in Horovod; the
    tensor is written by a kernel still running when it is submitted. Then DistributedOptimizer
    (op=Adasum) on a model on the GPU leaves the same weights on every rank."""
    import os

    import hvdtrain.torch as hvd

    hvd.init()
    device, n, r = gpu_of_local_rank(hvd), hvd.size(), hvd.rank()
    inputs = [torch.linspace(-1, 1, 1000, dtype=torch.float64) * (k + 1) + torch.cos(torch.arange(1000.0)) * k
              for k in range(n)]
    if os.environ.get("HOROVOD_GPU_OPERATIONS") == "MPI":
        expected = torch.from_numpy(adasum_reference([t.numpy() for t in inputs]))
    else:
        expected = torch.stack(inputs).mean(0)
    x = torch.zeros(1000, dtype=torch.float64, device=device)
    torch.cuda._sleep(100_000_000)
    x.copy_(inputs[r].to(device), non_blocking=True)
    got = hvd.allreduce(x, op=hvd.Adasum, name="adasum")
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-12, atol=1e-12)

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to(device)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(), op=hvd.Adasum)
    for step in range(3):
        optimizer.zero_grad()
        generator = torch.Generator(device=device).manual_seed(10 * step + r)
        model(torch.randn(8, 16, device=device, generator=generator)).square().mean().backward()
        optimizer.step()
    weights = hvd.allgather_object([p.detach().cpu().numpy().tobytes() for p in model.parameters()])
    assert all(w == weights[0] for w in weights), f"rank {r}: the ranks' weights differ"
    print(f"rank {r} adasum ok")


def test_collectives_through_nccl_on_one_gpu(alone):
    assert "rank 0 collectives ok" in alone(ranks_collectives, timeout=300).stdout


@pytest.mark.parametrize("way", SHARED_GPU)
@pytest.mark.parametrize("num_proc", [2, 3])
def test_collectives_of_ranks_sharing_a_gpu(mpirun, num_proc, way):
    result = mpirun(num_proc, ranks_collectives, timeout=400, env=SHARED_GPU[way])
    assert all(f"rank {r} collectives ok" in result.stdout for r in range(num_proc)), result.stdout


def test_a_cycle_run_on_the_callers_thread_leaves_its_stream_and_device(alone):
    assert "rank 0 cuda state ok" in alone(caller_cuda_state_kept).stdout


def test_a_kernel_still_running_on_the_callers_stream_is_waited_for_alone(alone):
    assert "rank 0 ordering ok" in alone(ranks_ordering).stdout


@pytest.mark.parametrize("way", SHARED_GPU)
def test_a_kernel_still_running_on_the_callers_stream_is_waited_for_by_ranks_sharing_a_gpu(mpirun, way):
    result = mpirun(2, ranks_ordering, timeout=180, env=SHARED_GPU[way])
    assert "rank 1 ordering ok" in result.stdout, result.stdout


def ranks_sharing_a_gpu_on_nccl():
    import hvdtrain.torch as hvd

    hvd.init()
    gpu_of_local_rank(hvd)
    try:
        hvd.allreduce(torch.ones(3, device="cuda"), name="shared")
    except hvd.HorovodInternalError as error:
        assert "NCCL needs one GPU per rank" in str(error) and "HOROVOD_GPU_OPERATIONS=MPI" in str(error), error
        print(f"rank {hvd.rank()} refused")
    hvd.allreduce(torch.ones(3), name="after")  # the host path still works


def test_ranks_sharing_a_gpu_are_refused_by_nccl_naming_the_way_out(mpirun):
    if torch.cuda.device_count() > 1:
        pytest.skip("the ranks would get a GPU each")
    result = mpirun(2, ranks_sharing_a_gpu_on_nccl, timeout=120)
    assert "rank 0 refused" in result.stdout and "rank 1 refused" in result.stdout, result.stdout


def test_adasum_of_cuda_tensors_alone(alone):
    assert "rank 0 adasum ok" in alone(ranks_adasum).stdout


@pytest.mark.parametrize("way", SHARED_GPU)
def test_adasum_of_cuda_tensors_of_ranks_sharing_a_gpu(mpirun, way):
    result = mpirun(2, ranks_adasum, timeout=180, env=SHARED_GPU[way])
    assert all(f"rank {r} adasum ok" in result.stdout for r in range(2)), result.stdout
