"""hvdtrain.torch where Horovod 0.28's behaviour is easy to get subtly wrong: alltoall's return
value, reducescatter's gradient, the scale factors per dtype, sparse gradients, the zero
gradients broadcast_optimizer_state leaves, and DistributedOptimizer on ranks outside its set."""

import numpy as np
import pytest
import torch

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, *FLOAT_DTYPES]


# ----------------------------------------------------------------------------- alltoall


def ranks_alltoall():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    rows = torch.arange(2 * n, dtype=torch.float32).unsqueeze(1) + 100 * r
    expected = torch.cat([torch.tensor([[2.0 * r], [2.0 * r + 1]]) + 100 * k for k in range(n)])
    # Without splits: the received tensor alone; with splits: (tensor, received splits).
    received = hvd.alltoall(rows)
    assert torch.is_tensor(received) and torch.equal(received, expected)
    received, received_splits = hvd.alltoall(rows, splits=[2] * n)
    assert torch.equal(received, expected)
    assert received_splits.dtype == torch.int32 and received_splits.tolist() == [2] * n
    # A handle's synchronize() gives both, with splits or without.
    for splits in (None, torch.full((n,), 2, dtype=torch.int32)):
        received, received_splits = hvd.synchronize(hvd.alltoall_async(rows, splits=splits))
        assert torch.equal(received, expected) and received_splits.tolist() == [2] * n
    # Differentiable without splits too: gradients go back to where the rows came from.
    x = torch.ones(n, 1, requires_grad=True)
    hvd.alltoall(x).backward(torch.arange(n, dtype=torch.float32).unsqueeze(1) + 10 * r)
    assert torch.equal(x.grad, torch.tensor([[float(r + 10 * k)] for k in range(n)]))

    # Float splits are refused before anything is submitted, on every rank, so the next
    # collective still pairs up (a cast would have sent other row counts than the peers expect).
    for splits, described in [(torch.ones(n), "a tensor of torch.float32"), ([1.0] * n, "float64 values"),
                              ([0.5] * (n - 1) + [n - 0.5 * (n - 1)], "float64 values")]:
        with pytest.raises(ValueError, match=f"alltoall: splits must be integers .*got {described}"):
            hvd.alltoall(torch.ones(n, 1), splits=splits)
    received, received_splits = hvd.alltoall(rows, splits=torch.full((n,), 2, dtype=torch.int64))
    assert torch.equal(received, expected) and received_splits.tolist() == [2] * n
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)))


@pytest.mark.parametrize("num_proc", [2, 3])
def test_alltoall_returns_and_refuses_as_horovod(mpirun, num_proc):
    mpirun(num_proc, ranks_alltoall, timeout=120)


# ----------------------------------------------------------------------------- reducescatter gradient


def ranks_reducescatter_gradient():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    # Horovod 0.28: the gathered output gradients, times prescale * postscale, times the
    # size for Sum only.
    cases = [(hvd.Sum, 1.0, 1.0, n), (hvd.Average, 1.0, 1.0, 1), (hvd.Sum, 0.5, 3.0, 1.5 * n),
             (hvd.Average, 0.5, 3.0, 1.5)]
    for op, prescale, postscale, factor in cases:
        x = torch.ones(2 * n, 1, dtype=torch.float64, requires_grad=True)
        out = hvd.reducescatter(x, op=op, prescale_factor=prescale, postscale_factor=postscale)
        out.backward(torch.full((2, 1), float(r + 1), dtype=torch.float64))
        expected = torch.cat([torch.full((2, 1), (k + 1) * factor, dtype=torch.float64) for k in range(n)])
        assert torch.equal(x.grad, expected), (op, prescale, postscale, x.grad)

        xs = [torch.ones(n, 2, requires_grad=True), torch.ones(2 * n, dtype=torch.float64, requires_grad=True)]
        outs = hvd.grouped_reducescatter(xs, op=op, prescale_factor=prescale, postscale_factor=postscale)
        torch.autograd.backward(outs, [torch.full((1, 2), float(r + 1)),
                                       torch.full((2,), float(r + 1), dtype=torch.float64)])
        assert torch.equal(xs[0].grad, torch.cat([torch.full((1, 2), (k + 1) * factor) for k in range(n)]))
        assert torch.equal(xs[1].grad, torch.cat([torch.full((2,), (k + 1) * factor, dtype=torch.float64)
                                                  for k in range(n)]))


@pytest.mark.parametrize("num_proc", [2, 3])
def test_reducescatter_gradient_is_horovods(mpirun, num_proc):
    mpirun(num_proc, ranks_reducescatter_gradient, timeout=120)


# ----------------------------------------------------------------------------- scale factors


def _compute_dtype(dtype):
    """Where Horovod scales on the CPU: integers in float64, 16-bit floats in float32."""
    if not dtype.is_floating_point:
        return torch.float64
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _scaled(tensor, factor):
    """`tensor` times `factor` as Horovod computes it, in the tensor's dtype."""
    compute = _compute_dtype(tensor.dtype)
    return (tensor.to(compute) * torch.tensor(factor, dtype=torch.float64).to(compute)).to(tensor.dtype)


def _expected_reduction(tensor, size, op, prescale, postscale):
    """Every rank holds `tensor`: each scales it by `prescale`, the sum is exact then rounded
    once to the dtype (the ranks add equal values), then it is scaled by `postscale`, with
    Average's 1/size folded in as Horovod folds it."""
    total = (_scaled(tensor, prescale).to(torch.float64) * size).to(tensor.dtype)
    return _scaled(total, postscale / size if op == "average" else postscale)


def _scale_cases(n):
    """(what, dtype, op, prescale, postscale, input) for every reducible dtype; Horovod's
    tests draw inputs in [-100, 100); here narrower where 8-bit sums must not overflow."""
    generator = torch.Generator().manual_seed(1234)
    factor = float(np.random.default_rng(1234).uniform())
    for dtype in DTYPES:
        low, high = {torch.uint8: (0, 80), torch.int8: (-40, 40)}.get(dtype, (-100, 100))
        for dim in (1, 2, 3):
            tensor = torch.randint(low, high, (2 * n,) * dim, generator=generator).to(dtype)
            ops = ["sum", "average"] if dtype.is_floating_point else ["sum"]
            for op in ops:
                for prescale, postscale in ((factor, 1.0), (1.0, factor), (factor, 1.0 / factor)):
                    yield dtype, dim, op, prescale, postscale, tensor


def ranks_scale_factors():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    ops = {"sum": hvd.Sum, "average": hvd.Average}
    wrong = []
    for dtype, dim, op, prescale, postscale, tensor in _scale_cases(n):
        expected = _expected_reduction(tensor, n, op, prescale, postscale)
        mine = expected[2 * r:2 * r + 2]
        kwargs = dict(op=ops[op], prescale_factor=prescale, postscale_factor=postscale)
        results = {
            "allreduce": (hvd.allreduce(tensor, **kwargs), expected),
            "grouped_allreduce": (hvd.grouped_allreduce([tensor, tensor[:1]], **kwargs)[1], expected[:1]),
            "reducescatter": (hvd.reducescatter(tensor, **kwargs), mine),
            "grouped_reducescatter": (hvd.grouped_reducescatter([tensor[:n], tensor], **kwargs)[1], mine),
        }
        # Horovod's tolerance at up to 3 ranks is none: the results must be exact.
        for what, (got, want) in results.items():
            if got.dtype != dtype or not torch.equal(got, want):
                wrong.append(f"{what} {str(dtype).replace('torch.', '')} {dim}-D {op} "
                             f"prescale={prescale:.4f} postscale={postscale:.4f}")
    assert not wrong, f"rank {r}: {len(wrong)} results differ from Horovod's:\n" + "\n".join(wrong)


@pytest.mark.parametrize("num_proc", [2, 3])
def test_scale_factors_match_horovod_for_every_dtype(mpirun, num_proc):
    mpirun(num_proc, ranks_scale_factors, timeout=300)


# ----------------------------------------------------------------------------- sparse gradients


def ranks_sparse_allreduce():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    generator = torch.Generator().manual_seed(r)
    for op in (hvd.Average, hvd.Sum):
        dense = torch.rand(7, 5, generator=generator, dtype=torch.float64)
        dense[dense < 0.7] = 0
        handle = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sparse.{op}", op=op)
        # Horovod's handle is a function to call; ours also works with synchronize().
        result = handle() if op == hvd.Average else hvd.synchronize(handle)
        assert result.is_sparse
        assert torch.allclose(result.to_dense(), hvd.allreduce(dense, op=op), rtol=0, atol=1e-15)


@pytest.mark.parametrize("num_proc", [2, 3])
def test_sparse_allreduce_async_equals_dense_allreduce(mpirun, num_proc):
    mpirun(num_proc, ranks_sparse_allreduce, timeout=120)


STEPS = 3
ROWS = 5  # per rank and step


def _sparse_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"embedding": torch.nn.Embedding(12, 4, sparse=True),
                                "head": torch.nn.Linear(4, 1)}).double()


def _sparse_batches(n):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 12, (n * ROWS,), generator=generator),
             torch.randn(n * ROWS, 1, generator=generator, dtype=torch.float64)) for _ in range(STEPS)]


def _sparse_loss(model, indices, targets, uses_embedding=True):
    features = model["embedding"](indices) if uses_embedding else torch.ones(len(indices), 4, dtype=torch.float64)
    return ((model["head"](features) - targets) ** 2).mean()


def _train_sparse(model, optimizer, n, rank, skip_embedding_on=None):
    """STEPS steps; rank `rank` of `n` takes its rows of each batch (all of them with
    rank=None). In the last step the ranks in `skip_embedding_on` do not use the embedding."""
    for step, (indices, targets) in enumerate(_sparse_batches(n)):
        optimizer.zero_grad()
        losses = []
        for k in range(n) if rank is None else [rank]:
            rows = slice(k * ROWS, (k + 1) * ROWS)
            uses = not (step == STEPS - 1 and k in (skip_embedding_on or ()))
            losses.append(_sparse_loss(model, indices[rows], targets[rows], uses))
        # One process averages the ranks' losses, as the ranks average their gradients.
        (sum(losses) / len(losses)).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ranks_sparse_training():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    # SparseAdam on the embedding alone, its gradients reduced sparse or densified.
    for sparse_as_dense in (False, True):
        reference = _sparse_model()
        expected = _train_sparse(reference, torch.optim.SparseAdam(list(reference["embedding"].parameters()),
                                                                   lr=0.1), n, None)
        model = _sparse_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model["embedding"].parameters()), lr=0.1),
                                             named_parameters=model["embedding"].named_parameters(),
                                             sparse_as_dense=sparse_as_dense)
        got = _train_sparse(model, optimizer, n, r)
        assert torch.allclose(got, expected, rtol=0, atol=1e-12), (sparse_as_dense, (got - expected).abs().max())

    # SGD on the sparse embedding and a dense layer together, the embedding unused on the last
    # rank in the last step (it sends an empty sparse gradient instead of a dense one).
    reference = _sparse_model()
    expected = _train_sparse(reference, torch.optim.SGD(reference.parameters(), lr=0.5), n, None,
                             skip_embedding_on={n - 1})
    model = _sparse_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters())
    got = _train_sparse(model, optimizer, n, r, skip_embedding_on={n - 1})
    assert torch.allclose(got, expected, rtol=0, atol=1e-12), (got - expected).abs().max()
    assert not model["head"].weight.grad.is_sparse and model["embedding"].weight.grad.is_sparse


@pytest.mark.parametrize("num_proc", [2, 3])
def test_sparse_gradients_train_like_one_process_with_the_whole_batch(mpirun, num_proc):
    mpirun(num_proc, ranks_sparse_training, timeout=180)


# ----------------------------------------------------------------------------- broadcast_optimizer_state


def ranks_zero_gradients():
    import hvdtrain.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 2), "unused": torch.nn.Linear(2, 2),
                                 "embedding": torch.nn.Embedding(5, 3, sparse=True)})
    model["unused"].bias.requires_grad_(False)
    dense = [model["used"], model["unused"]]
    dense_params = [p for m in dense for p in m.parameters()]

    # A fresh optimizer: Horovod leaves a zero gradient on every parameter that requires one,
    # sparse for the model's sparse embeddings; a DistributedOptimizer's are its bucket views.
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0, model=model)
    for p in dense_params:
        if p.requires_grad:
            assert not p.grad.is_sparse and torch.count_nonzero(p.grad) == 0
            assert p.grad.data_ptr() == optimizer._buckets.view[p].data_ptr()
            torch.empty_like(p.grad)  # what Horovod scripts do with it
        else:
            assert p.grad is None
    embedding_grad = model["embedding"].weight.grad
    assert embedding_grad.is_sparse and torch.count_nonzero(embedding_grad.to_dense()) == 0
    # Training goes on from there, the embedding's gradients reduced sparse.
    out = model["used"](model["embedding"](torch.tensor([hvd.rank()])))
    out.sum().backward()
    optimizer.step()
    assert model["embedding"].weight.grad.is_sparse

    # A plain torch optimizer, with state to initialize: zero gradients, no step taken.
    weights = [p.detach().clone() for p in dense_params]
    adam = torch.optim.Adam([p for p in dense_params if p.requires_grad], lr=0.1, weight_decay=0.1)
    for p in dense_params:
        p.grad = None
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in dense_params if p.requires_grad)
    assert all(torch.equal(p.detach(), w) for p, w in zip(dense_params, weights))

    # SparseAdam gets sparse zeros.
    sparse_adam = torch.optim.SparseAdam(list(model["embedding"].parameters()))
    model["embedding"].weight.grad = None
    hvd.broadcast_optimizer_state(sparse_adam, root_rank=0)
    assert model["embedding"].weight.grad.is_sparse


@pytest.mark.parametrize("num_proc", [2, 3])
def test_broadcast_optimizer_state_leaves_zero_gradients(mpirun, num_proc):
    mpirun(num_proc, ranks_zero_gradients, timeout=120)


# ----------------------------------------------------------------------------- process sets


def ranks_optimizer_outside_its_process_set():
    import hvdtrain.torch as hvd

    members = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[members])
    n, r = hvd.size(), hvd.rank()
    generator = torch.Generator().manual_seed(3)
    inputs, targets = torch.randn(3 * n, 4, generator=generator, dtype=torch.float64), \
        torch.randn(3 * n, 1, generator=generator, dtype=torch.float64)

    def train(optimizer, model, rows):
        for _ in range(2):
            optimizer.zero_grad()
            ((model(inputs[rows]) - targets[rows]) ** 2).mean().backward()
            optimizer.step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def model():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 1).double()

    # Horovod creates the optimizer on every rank; outside the set it reduces nothing.
    mine = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(mine.parameters(), lr=0.1), process_set=members)
    got = train(optimizer, mine, slice(3 * r, 3 * r + 3))
    reference = model()
    # Members: one process with both members' rows; the other rank: its own rows alone.
    rows = torch.cat([torch.arange(3 * k, 3 * k + 3) for k in members.ranks]) if r in members.ranks \
        else torch.arange(3 * r, 3 * r + 3)
    expected = train(torch.optim.SGD(reference.parameters(), lr=0.1), reference, rows)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12), f"rank {r}: {(got - expected).abs().max()}"
    # Nobody hangs: a global collective afterwards pairs up.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def test_distributed_optimizer_on_a_rank_outside_its_process_set(mpirun):
    mpirun(3, ranks_optimizer_outside_its_process_set, timeout=120)
