"""Training on CUDA with hvdtrain.torch: DistributedOptimizer on N ranks x batch b ends with the
weights of one process with batch N*b (float64; backward_passes_per_step 1 and 2); Horovod's AMP
pattern with GradScaler; SyncBatchNorm against BatchNorm over the whole batch; fp16 compression
on the device. Several ranks share the one GPU through host memory or through NCCL, the ranks
joined as hosts of their own (gpu/support.py)."""

import pytest
import torch

from gpu.support import SHARED_GPU, gpu_of_local_rank

STEPS, PER_RANK = 4, 6


def _model(device, dtype=torch.float64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3)).to(device, dtype)


def _batches(n, passes, device, dtype=torch.float64):
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        rows = n * PER_RANK * passes
        yield (torch.randn(rows, 7, generator=generator, dtype=dtype).to(device),
               torch.randint(0, 3, (rows,), generator=generator).to(device))


def _train(model, optimizer, batches, select, passes, scaler=None):
    loss_fn = torch.nn.CrossEntropyLoss()
    for inputs, targets in batches:
        optimizer.zero_grad()
        for p in range(passes):
            x, y = select(inputs, targets, p)
            with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
                loss = loss_fn(model(x), y) / passes
            (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is None:
            optimizer.step()
            continue
        distributed = hasattr(optimizer, "skip_synchronize")
        if distributed:
            optimizer.synchronize()  # Horovod's documented AMP pattern
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        if distributed:
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ranks_equivalence():
    import hvdtrain.torch as hvd

    hvd.init()
    device, n, r = gpu_of_local_rank(hvd), hvd.size(), hvd.rank()

    def my_part(x, y, p):
        start = p * n * PER_RANK + r * PER_RANK
        return x[start:start + PER_RANK], y[start:start + PER_RANK]

    for passes in (1, 2):
        reference = _model(device)
        expected = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9),
                          _batches(n, passes, device), lambda x, y, p: (x, y), 1)
        model = _model(device)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                             named_parameters=model.named_parameters(),
                                             backward_passes_per_step=passes)
        got = _train(model, optimizer, _batches(n, passes, device), my_part, passes)
        difference = (got - expected).abs().max().item()
        assert difference < 1e-12, f"rank {r}, passes {passes}: {difference} from the large-batch run"

    # AMP (fp16 autocast, GradScaler): the same pattern as one process with the whole batch.
    reference = _model(device, torch.float32)
    scaler = torch.amp.GradScaler("cuda")
    expected = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.1), _batches(n, 1, device,
                      torch.float32), lambda x, y, p: (x, y), 1, scaler)
    model = _model(device, torch.float32)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    got = _train(model, optimizer, _batches(n, 1, device, torch.float32), my_part, 1, torch.amp.GradScaler("cuda"))
    assert torch.allclose(got, expected, atol=2e-3), f"rank {r}: AMP differs by {(got - expected).abs().max()}"

    # fp16 compression on the device: averaged in half precision, handed back in float32. NCCL's
    # average (ncclAvg, as Horovod's) scales each rank's part by 1/n in half precision: exact
    # where n is a power of two, else within a unit in the last place (2.0 at 3 ranks: 1.999).
    gradient = torch.full((1000,), float(r + 1), device=device)
    averaged = hvd.allreduce(gradient, compression=hvd.Compression.fp16, name="compressed")
    assert averaged.dtype == torch.float32 and averaged.is_cuda
    assert torch.allclose(averaged, torch.full_like(averaged, (n + 1) / 2), rtol=2 ** -10, atol=0), averaged
    print(f"rank {r} training ok")


def ranks_sync_batch_norm():
    import hvdtrain.torch as hvd

    hvd.init()
    device, n, r = gpu_of_local_rank(hvd), hvd.size(), hvd.rank()
    torch.manual_seed(3)
    whole = torch.randn(4 * n, 5, 6, 6, dtype=torch.float64, device=device, requires_grad=True)
    reference = torch.nn.BatchNorm2d(5).to(device, torch.float64)
    expected = reference(whole)
    expected.pow(2).sum().backward()
    mine = whole.detach()[4 * r:4 * r + 4].clone().requires_grad_()
    sync = hvd.SyncBatchNorm(5).to(device, torch.float64)
    out = sync(mine)
    out.pow(2).sum().backward()
    assert torch.allclose(out, expected[4 * r:4 * r + 4], atol=1e-10)
    assert torch.allclose(mine.grad, whole.grad[4 * r:4 * r + 4], atol=1e-10)
    assert torch.allclose(sync.running_mean, reference.running_mean, atol=1e-12)
    print(f"rank {r} sync batch norm ok")


@pytest.mark.parametrize("segment_bytes", ["26214400", "2000"])
def test_distributed_optimizer_on_one_gpu_through_nccl(alone, segment_bytes):
    """The model in one segment (the default size), and in several, each copied into the bucket
    on the stream that computed it. HOROVOD_ELASTIC=1 marks the job elastic (its world may
    grow), so that its one rank still reduces through the engine, as Horovod's would."""
    env = {"HOROVOD_ELASTIC": "1", "HVDTRAIN_SEGMENT_BYTES": segment_bytes}
    assert "rank 0 training ok" in alone(ranks_equivalence, timeout=300, env=env).stdout


@pytest.mark.parametrize("way", SHARED_GPU)
@pytest.mark.parametrize("num_proc", [2, 3])
def test_distributed_optimizer_matches_the_large_batch_on_a_shared_gpu(mpirun, num_proc, way):
    result = mpirun(num_proc, ranks_equivalence, timeout=300, env=SHARED_GPU[way])
    assert all(f"rank {k} training ok" in result.stdout for k in range(num_proc)), result.stdout


@pytest.mark.parametrize("way", SHARED_GPU)
def test_sync_batch_norm_on_cuda_matches_batch_norm_over_the_whole_batch(mpirun, way):
    result = mpirun(2, ranks_sync_batch_norm, timeout=180, env=SHARED_GPU[way])
    assert "rank 1 sync batch norm ok" in result.stdout, result.stdout
