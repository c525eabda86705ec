"""DistributedOptimizer on real ranks (hvdtrain/torch/optimizer.py): N ranks x batch b train exactly
like one process with batch N*b, on 2, 3 and 4 ranks, with one or two backward passes per step,
gradients set to None or zeroed, whatever the segments (HVDTRAIN_SEGMENT_BYTES), with closers
alone hooked from the second step, with groups, with sparse gradients, within a process set and
outside it; groups and fp16 compression average alike; Horovod's checks of misuse hold; and in a
job of one rank (HOROVOD_ELASTIC=1, which reduces even there) a step submits one allreduce per
segment and channels_last gradients keep their layout. Where two pairs of ranks train side by side,
the gradients of hvdtrain.torch's collectives within a pair's set are checked too (the other
collectives are in tests/parallel/test_torch.py). Its parts that need no ranks are in
tests/single/torch/test_optimizer.py."""

import os
import warnings

import pytest
import torch

import hvdtrain.torch as hvd
from hvdtrain.torch.optimizer import HUGE_PAGE_BYTES, _Hooks

STEPS = 4
PER_RANK_BATCH = 6
# Wide enough that the float64 gradients fill more than 2 MiB: the optimizer's bucket then lies on
# huge pages, as a real model's does.
HIDDEN = 512


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(7, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 3)
    ).double()


def _batches(world_size, passes):
    """The global batch of every step, as (inputs, targets); rank r's part of a pass is rows
    [r*b, (r+1)*b) of that pass's block."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        rows = world_size * PER_RANK_BATCH * passes
        yield torch.randn(rows, 7, generator=generator, dtype=torch.float64), torch.randint(0, 3, (rows,), generator=generator)


def _train(model, optimizer, batches, select, passes, set_to_none=True):
    loss_fn = torch.nn.CrossEntropyLoss()
    for inputs, targets in batches:
        optimizer.zero_grad(set_to_none=set_to_none)
        if set_to_none:  # as in plain PyTorch; otherwise zeros that backward accumulates into
            assert all(p.grad is None for p in model.parameters())
        for p in range(passes):
            x, y = select(inputs, targets, p)
            # Each pass averages over its micro-batch; the 1/passes makes the accumulated
            # gradient the mean over the whole step's samples, as Horovod's examples do.
            (loss_fn(model(x), y) / passes).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ----------------------------------------------------------------------------- the large batch


def _trains_like_the_large_batch(passes, set_to_none):
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    reference = _model()
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    # One process, one batch of all the step's samples.
    expected = _train(reference, reference_opt, _batches(n, passes), lambda x, y, p: (x, y), 1)

    model = _model()
    assert sum(p.numel() * p.element_size() for p in model.parameters()) >= HUGE_PAGE_BYTES
    if r != 0:  # other initial weights: broadcast_parameters must replace them with rank 0's
        torch.manual_seed(100 + r)
        for p in model.parameters():
            p.data.add_(torch.randn_like(p))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
        named_parameters=model.named_parameters(), backward_passes_per_step=passes)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def my_part(x, y, p):
        start = p * n * PER_RANK_BATCH + r * PER_RANK_BATCH
        return x[start:start + PER_RANK_BATCH], y[start:start + PER_RANK_BATCH]

    got = _train(model, optimizer, _batches(n, passes), my_part, passes, set_to_none)
    difference = (got - expected).abs().max().item()
    assert difference < 1e-12, (
        f"rank {r}, backward_passes_per_step={passes}, set_to_none={set_to_none}: "
        f"weights differ from the large-batch run by {difference}")
    # Every rank holds the same weights, bit for bit.
    gathered = hvd.allgather(got.unsqueeze(0))
    assert torch.equal(gathered, got.unsqueeze(0).expand_as(gathered)), "ranks disagree"
    hvd.shutdown()


def one_backward_pass_a_step_trains_like_one_process_with_the_whole_batch():
    _trains_like_the_large_batch(1, True)


def two_backward_passes_a_step_train_like_one_process_with_the_whole_batch():
    _trains_like_the_large_batch(2, True)


def two_passes_with_gradients_zeroed_not_set_to_none_train_like_the_whole_batch():
    _trains_like_the_large_batch(2, False)


EQUIVALENCE = [one_backward_pass_a_step_trains_like_one_process_with_the_whole_batch,
               two_backward_passes_a_step_train_like_one_process_with_the_whole_batch,
               two_passes_with_gradients_zeroed_not_set_to_none_train_like_the_whole_batch]


# ----------------------------------------------------------------------------- closers


def _closers_keep_the_large_batch_result(name, orders, zeroing):
    """From the second step only each segment's closer has a hook. The result stays the large
    batch's where backward's order changes (`orders`: the layers' order each step) and where
    gradients are not set to None before a step (`zeroing`), so that they accumulate."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    generator = torch.Generator().manual_seed(2)
    data = torch.randn(5, n * PER_RANK_BATCH, 5, generator=generator, dtype=torch.float64)

    def run(x_of_step, distributed):
        torch.manual_seed(0)
        layers = torch.nn.ModuleList(torch.nn.Linear(5, 5) for _ in range(3)).double()
        optimizer = torch.optim.SGD(layers.parameters(), lr=0.1)
        if distributed:
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=layers.named_parameters())
        hooks = []
        for step, (order, zero) in enumerate(zip(orders, zeroing)):
            if zero:
                optimizer.zero_grad()
            x = x_of_step(step)
            for i in order:
                x = torch.tanh(layers[i](x))
            x.sum(dim=1).mean().backward()
            optimizer.step()
            hooks.append(getattr(optimizer, "_hooks", None))
        return torch.cat([p.detach().reshape(-1) for p in layers.parameters()]), hooks

    expected, _ = run(lambda step: data[step], distributed=False)
    mine = slice(r * PER_RANK_BATCH, (r + 1) * PER_RANK_BATCH)
    got, hooks = run(lambda step: data[step, mine], distributed=True)
    difference = (got - expected).abs().max().item()
    assert difference < 1e-12, f"{name}: weights differ from the large-batch run by {difference}"
    # Closers took over after the first step, and every gradient's hook came back for good
    # when they could not tell in step 2: the closer of the one segment came before the
    # others, which were None or last step's (a segment of one parameter is closed by it in
    # any order).
    alone = name == "order changes" and os.environ.get("HVDTRAIN_SEGMENT_BYTES") == "0"
    expected_hooks = ([_Hooks.CLOSERS] * 5 if alone else
                      [_Hooks.CLOSERS] * 2 + [_Hooks.EVERY_GRADIENT_FOR_GOOD] * 3)
    assert hooks == expected_hooks, (name, hooks)
    gathered = hvd.allgather(got.unsqueeze(0))
    assert torch.equal(gathered, got.unsqueeze(0).expand_as(gathered)), f"{name}: ranks disagree"
    hvd.shutdown()


ORDERS = [[0, 1, 2], [0, 1, 2], [2, 0, 1], [0, 1, 2], [0, 1, 2]]


def closers_keep_the_large_batch_result_where_backwards_order_changes():
    _closers_keep_the_large_batch_result("order changes", ORDERS, [True] * 5)


def closers_keep_the_large_batch_result_where_gradients_accumulate_over_steps():
    _closers_keep_the_large_batch_result("order changes, not set to None", ORDERS, [True, True, False, True, True])


CLOSERS = [closers_keep_the_large_batch_result_where_backwards_order_changes,
           closers_keep_the_large_batch_result_where_gradients_accumulate_over_steps]


# ----------------------------------------------------------------------------- groups, compression


def _averages_alike(options, tolerance):
    """groups and Compression.fp16 change how gradients travel, not the average they give."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    reference = _model()
    for k in range(n):
        reference(torch.full((4, 7), float(k + 1), dtype=torch.float64)).sum().backward()
    expected = [p.grad / n for p in reference.parameters()]
    model = _model()
    params = list(model.parameters())
    if options.get("groups") == "first and last":
        options = {"groups": [[params[0], params[-1]]]}
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                         named_parameters=model.named_parameters(), **options)
    model(torch.full((4, 7), float(r + 1), dtype=torch.float64)).sum().backward()
    optimizer.synchronize()
    for p, want in zip(params, expected):
        error = ((p.grad - want).abs().max() / want.abs().max()).item()
        assert error < tolerance, f"{options}: averaged gradient off by {error} (relative)"
    hvd.shutdown()


def a_number_of_groups_averages_alike():
    _averages_alike({"groups": 2}, 1e-12)


def groups_given_as_lists_of_parameters_average_alike():
    _averages_alike({"groups": "first and last"}, 1e-12)


def fp16_compression_averages_within_half_precision():
    _averages_alike({"compression": hvd.Compression.fp16}, 2e-3)


GROUPS = [a_number_of_groups_averages_alike, groups_given_as_lists_of_parameters_average_alike,
          fp16_compression_averages_within_half_precision]


# ----------------------------------------------------------------------------- Horovod's rules


def gradients_clipped_between_synchronize_and_step_are_applied_in_skip_synchronize():
    """As Horovod documents it; the averaged gradient is that of the mean of the ranks' inputs."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.full((4, 7), float(r + 1), dtype=torch.float64)).sum().backward()
    optimizer.synchronize()
    averaged = [p.grad.clone() for p in model.parameters()]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with optimizer.skip_synchronize():
        optimizer.step()
    reference = _model()
    for k in range(n):
        reference(torch.full((4, 7), float(k + 1), dtype=torch.float64)).sum().backward()
    for got, ref in zip(averaged, reference.parameters()):
        assert torch.allclose(got, ref.grad / n, atol=1e-12), "synchronize() did not average gradients"
    hvd.shutdown()


def _after_one_step():
    """A model, its DistributedOptimizer one step on (closers hooked), and an input."""
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    x = torch.full((4, 7), float(hvd.rank() + 1), dtype=torch.float64)
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    return model, optimizer, x


def zero_grad_between_backward_and_step_is_refused():
    """A race Horovod forbids."""
    hvd.init()
    model, optimizer, x = _after_one_step()
    optimizer.zero_grad()
    model(x).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.step()
    hvd.shutdown()


def a_second_backward_before_step_is_refused_with_one_pass_a_step():
    hvd.init()
    model, optimizer, x = _after_one_step()
    optimizer.zero_grad()
    model(x).sum().backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        model(x).sum().backward()
    optimizer.step()
    hvd.shutdown()


def a_parameter_used_on_some_ranks_only_gets_the_average_with_their_zeros():
    """A dynamic graph; model.zero_grad(set_to_none=True) is respected."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 3).double(), torch.nn.Linear(3, 3).double()
    hvd.broadcast_parameters(list(a.named_parameters()) + [(f"b.{k}", v) for k, v in b.named_parameters()], 0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=1.0))
    a.zero_grad(set_to_none=True)
    b.zero_grad(set_to_none=True)
    out = a(torch.ones(1, 3, dtype=torch.float64))
    if r == 0:
        out = b(out)
    out.sum().backward()
    before = b.weight.detach().clone()
    opt.step()
    local = b.weight.grad.clone()
    total = hvd.allreduce(local, op=hvd.Sum)
    assert torch.allclose(total, local * n), "ranks disagree on the averaged gradient of b"
    assert torch.allclose(b.weight.detach(), before - local), "step did not apply the averaged gradient"
    hvd.shutdown()


def sparse_gradients_are_averaged_like_their_dense_equivalents():
    """nn.Embedding(sparse=True)."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4, sparse=True).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=1.0))
    start = embedding.weight.detach().clone()
    embedding(torch.tensor([r, r + 1])).sum().backward()
    opt.step()
    expected = start.clone()
    for k in range(n):
        expected[[k, k + 1]] -= 1.0 / n
    assert torch.allclose(embedding.weight.detach(), expected), "sparse gradient average is wrong"
    hvd.shutdown()


def named_parameters_that_repeat_a_name_or_miss_a_parameter_are_refused():
    hvd.init()
    model = _model()
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("w", p) for p in model.parameters()])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=list(model.named_parameters())[:1])
    hvd.shutdown()


RULES = [gradients_clipped_between_synchronize_and_step_are_applied_in_skip_synchronize,
         zero_grad_between_backward_and_step_is_refused, a_second_backward_before_step_is_refused_with_one_pass_a_step,
         a_parameter_used_on_some_ranks_only_gets_the_average_with_their_zeros,
         sparse_gradients_are_averaged_like_their_dense_equivalents,
         named_parameters_that_repeat_a_name_or_miss_a_parameter_are_refused]


# ----------------------------------------------------------------------------- sparse training

SPARSE_STEPS = 3
SPARSE_ROWS = 5  # per rank and step


def _sparse_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"embedding": torch.nn.Embedding(12, 4, sparse=True),
                                "head": torch.nn.Linear(4, 1)}).double()


def _sparse_batches(n):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 12, (n * SPARSE_ROWS,), generator=generator),
             torch.randn(n * SPARSE_ROWS, 1, generator=generator, dtype=torch.float64)) for _ in range(SPARSE_STEPS)]


def _sparse_loss(model, indices, targets, uses_embedding=True):
    features = model["embedding"](indices) if uses_embedding else torch.ones(len(indices), 4, dtype=torch.float64)
    return ((model["head"](features) - targets) ** 2).mean()


def _train_sparse(model, optimizer, n, rank, skip_embedding_on=None):
    """SPARSE_STEPS steps; rank `rank` of `n` takes its rows of each batch (all of them with
    rank=None). In the last step the ranks in `skip_embedding_on` do not use the embedding."""
    for step, (indices, targets) in enumerate(_sparse_batches(n)):
        optimizer.zero_grad()
        losses = []
        for k in range(n) if rank is None else [rank]:
            rows = slice(k * SPARSE_ROWS, (k + 1) * SPARSE_ROWS)
            uses = not (step == SPARSE_STEPS - 1 and k in (skip_embedding_on or ()))
            losses.append(_sparse_loss(model, indices[rows], targets[rows], uses))
        # One process averages the ranks' losses, as the ranks average their gradients.
        (sum(losses) / len(losses)).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _sparse_adam_trains_like_one_process(sparse_as_dense):
    """SparseAdam on the embedding alone."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    reference = _sparse_model()
    expected = _train_sparse(reference, torch.optim.SparseAdam(list(reference["embedding"].parameters()), lr=0.1),
                             n, None)
    model = _sparse_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model["embedding"].parameters()), lr=0.1),
                                         named_parameters=model["embedding"].named_parameters(),
                                         sparse_as_dense=sparse_as_dense)
    got = _train_sparse(model, optimizer, n, r)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12), (sparse_as_dense, (got - expected).abs().max())
    hvd.shutdown()


def sparse_adam_with_sparse_gradients_trains_like_one_process_with_the_whole_batch():
    _sparse_adam_trains_like_one_process(sparse_as_dense=False)


def sparse_adam_with_gradients_made_dense_trains_like_one_process_with_the_whole_batch():
    _sparse_adam_trains_like_one_process(sparse_as_dense=True)


def sparse_and_dense_gradients_train_together_where_a_rank_leaves_the_embedding_unused():
    """SGD on the sparse embedding and a dense layer together, the embedding unused on the last
    rank in the last step (it sends an empty sparse gradient instead of a dense one)."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    reference = _sparse_model()
    expected = _train_sparse(reference, torch.optim.SGD(reference.parameters(), lr=0.5), n, None,
                             skip_embedding_on={n - 1})
    model = _sparse_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters())
    got = _train_sparse(model, optimizer, n, r, skip_embedding_on={n - 1})
    assert torch.allclose(got, expected, rtol=0, atol=1e-12), (got - expected).abs().max()
    assert not model["head"].weight.grad.is_sparse and model["embedding"].weight.grad.is_sparse
    hvd.shutdown()


SPARSE = [sparse_adam_with_sparse_gradients_trains_like_one_process_with_the_whole_batch,
          sparse_adam_with_gradients_made_dense_trains_like_one_process_with_the_whole_batch,
          sparse_and_dense_gradients_train_together_where_a_rank_leaves_the_embedding_unused]


# ----------------------------------------------------------------------------- process sets


def two_pairs_of_ranks_train_side_by_side_each_like_its_own_large_batch():
    """Each pair data-parallel within itself, on its own data."""
    pairs = [hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])]
    hvd.init(process_sets=pairs)
    r = hvd.rank()
    mine = pairs[r // 2]
    position = mine.rank()

    def pair_batches():
        return [(x + r // 2, y) for x, y in _batches(2, 1)]

    reference = _model()
    expected = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), pair_batches(),
                      lambda x, y, p: (x, y), 1)
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(), process_set=mine)
    rows = slice(position * PER_RANK_BATCH, (position + 1) * PER_RANK_BATCH)
    got = _train(model, optimizer, pair_batches(), lambda x, y, p: (x[rows], y[rows]), 1)
    difference = (got - expected).abs().max().item()
    assert difference < 1e-12, f"rank {r}: weights differ from its pair's large-batch run by {difference}"
    across = hvd.allgather(got.unsqueeze(0))  # the global set: the pairs trained different models
    assert torch.equal(across[0], across[1]) and torch.equal(across[2], across[3])
    assert not torch.equal(across[0], across[2])
    hvd.shutdown()


def gradients_through_the_collectives_of_a_pairs_set_stay_within_it():
    """Allgather's backward takes this rank's rows at its position in the set, reducescatter's
    (Sum) multiplies by the set's size; broadcast's root is a rank of the job."""
    pairs = [hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])]
    hvd.init(process_sets=pairs)
    r = hvd.rank()
    mine = pairs[r // 2]
    position = mine.rank()
    x = torch.full((position + 1, 2), float(r), requires_grad=True)
    gathered = hvd.allgather(x, process_set=mine)
    assert gathered[:, 0].tolist() == [float(k) for k in mine.ranks for _ in range(mine.ranks.index(k) + 1)]
    (gathered * torch.arange(6.0).reshape(3, 2)).sum().backward()
    assert torch.equal(x.grad, torch.arange(6.0).reshape(3, 2)[position:2 * position + 1])
    x = torch.ones(4, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum, process_set=mine).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 2.0))
    assert torch.equal(hvd.broadcast(torch.tensor([float(r)]), mine.ranks[1], process_set=mine),
                       torch.tensor([float(mine.ranks[1])]))
    hvd.shutdown()


def a_rank_outside_the_optimizers_process_set_trains_alone():
    """Horovod creates the optimizer on every rank; outside the set it reduces nothing, and nobody
    hangs: a global collective afterwards pairs up."""
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

    mine = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(mine.parameters(), lr=0.1), process_set=members)
    got = train(optimizer, mine, slice(3 * r, 3 * r + 3))
    reference = model()
    # Members: one process with both members' rows; the other rank: its own rows alone.
    rows = torch.cat([torch.arange(3 * k, 3 * k + 3) for k in members.ranks]) if r in members.ranks \
        else torch.arange(3 * r, 3 * r + 3)
    expected = train(torch.optim.SGD(reference.parameters(), lr=0.1), reference, rows)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12), f"rank {r}: {(got - expected).abs().max()}"
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    hvd.shutdown()


def an_optimizer_made_after_one_of_a_process_set_names_its_buckets_alike_everywhere():
    """Every rank makes an optimizer of a set of 2 of 3 ranks, then one of all ranks: its
    buckets are named alike on every rank (or no rank could step), and the names it makes up for
    parameters given without names are unique and the same everywhere."""
    members = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[members])
    n = hvd.size()
    hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1), process_set=members)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)).double()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    names = [optimizer._parameter_names[p] for p in model.parameters()]
    assert len(set(names)) == 4 and hvd.allgather_object(names) == [names] * n
    optimizer.zero_grad()
    model(torch.full((2, 4), float(hvd.rank()), dtype=torch.float64)).sum().backward()
    optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert hvd.allgather_object(weights.tolist()) == [weights.tolist()] * n  # one step, the same everywhere
    hvd.shutdown()


# ----------------------------------------------------------------------------- the jobs on ranks

def _at_segment_bytes(check, segment_bytes):
    """`check` with HVDTRAIN_SEGMENT_BYTES=segment_bytes (which hvd.init reads), under a name of its
    own in this module, where rank_main finds the checks of a job."""
    def check_at_segment_bytes():
        os.environ["HVDTRAIN_SEGMENT_BYTES"] = segment_bytes
        try:
            check()
        finally:
            del os.environ["HVDTRAIN_SEGMENT_BYTES"]

    check_at_segment_bytes.__name__ = f"{check.__name__}_at_segment_bytes_{segment_bytes}"
    globals()[check_at_segment_bytes.__name__] = check_at_segment_bytes
    return check_at_segment_bytes


# The segments besides the default, which puts _model() in one: 0 puts each gradient on its own
# (Horovod's way); 20000 splits it unevenly. The job of 3 ranks runs these checks after its own,
# since starting ranks costs more than the checks.
AT_SEGMENT_BYTES = {(check, segment_bytes): _at_segment_bytes(check, segment_bytes)
                    for segment_bytes, checks in (("0", EQUIVALENCE + CLOSERS), ("20000", EQUIVALENCE))
                    for check in checks}

# Which checks each job runs, by its ranks.
JOBS = {
    2: EQUIVALENCE + SPARSE,
    3: EQUIVALENCE + CLOSERS + GROUPS + RULES + SPARSE + [
        a_rank_outside_the_optimizers_process_set_trains_alone,
        an_optimizer_made_after_one_of_a_process_set_names_its_buckets_alike_everywhere,
        *AT_SEGMENT_BYTES.values()],
    4: EQUIVALENCE + [two_pairs_of_ranks_train_side_by_side_each_like_its_own_large_batch,
                      gradients_through_the_collectives_of_a_pairs_set_stay_within_it],
}


def job(ranks, num_proc):
    return ranks.run(num_proc, JOBS[num_proc], timeout=480)


def assert_passed(ranks, num_proc, check, segment_bytes=None):
    """That `check` (run at `segment_bytes`, None: the default) passed on every rank of the job."""
    job(ranks, num_proc).assert_passed(check if segment_bytes is None else AT_SEGMENT_BYTES[check, segment_bytes])


@pytest.mark.parametrize("num_proc, segment_bytes", [(2, None), (3, None), (4, None), (3, "0"), (3, "20000")])
@pytest.mark.parametrize("check", EQUIVALENCE, ids=lambda check: check.__name__)
def test_training_matches_one_process_with_the_whole_batch(ranks, check, num_proc, segment_bytes):
    assert_passed(ranks, num_proc, check, segment_bytes)


@pytest.mark.parametrize("segment_bytes", [None, "0"])
@pytest.mark.parametrize("check", CLOSERS, ids=lambda check: check.__name__)
def test_closing_gradients_alone_keep_the_large_batch_result(ranks, check, segment_bytes):
    assert_passed(ranks, 3, check, segment_bytes)


@pytest.mark.parametrize("check", GROUPS + RULES, ids=lambda check: check.__name__)
def test_horovods_options_and_rules_on_three_ranks(ranks, check):
    job(ranks, 3).assert_passed(check)


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("check", SPARSE, ids=lambda check: check.__name__)
def test_sparse_gradients_train_like_one_process_with_the_whole_batch(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("check", [a_rank_outside_the_optimizers_process_set_trains_alone,
                                   an_optimizer_made_after_one_of_a_process_set_names_its_buckets_alike_everywhere],
                         ids=lambda check: check.__name__)
def test_optimizers_of_a_process_set_on_three_ranks(ranks, check):
    job(ranks, 3).assert_passed(check)


@pytest.mark.parametrize("check", [two_pairs_of_ranks_train_side_by_side_each_like_its_own_large_batch,
                                   gradients_through_the_collectives_of_a_pairs_set_stay_within_it],
                         ids=lambda check: check.__name__)
def test_two_pairs_of_ranks_side_by_side(ranks, check):
    job(ranks, 4).assert_passed(check)


# ----------------------------------------------------------------------------- a job of one rank

# An elastic job's world may grow, so Horovod's DistributedOptimizer reduces in it even at one
# rank, as ours does: these checks run one process and still go through the engine.
ELASTIC_JOB = {"HOROVOD_ELASTIC": "1"}


def channels_last_gradients_keep_their_layout_in_the_bucket():
    """A job of one rank reduces through the engine; a channels_last model's gradients keep its
    layout in the bucket, without autograd's layout warning, and the step is plain SGD's."""
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)).double()
    model = model.to(memory_format=torch.channels_last)
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)).double()
    reference.load_state_dict(model.state_dict())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    assert optimizer._buckets is not None, "HOROVOD_ELASTIC=1 did not make a job of one rank reduce"
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "grad and param do not obey the gradient layout contract"
        model(x.to(memory_format=torch.channels_last)).sum().backward()
        optimizer.step()
    reference(x).sum().backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.grad.stride() == p.stride(), (p.shape, p.grad.stride(), p.stride())
        assert torch.allclose(p, q, atol=1e-12)
    hvd.shutdown()


def a_step_submits_one_allreduce_per_segment_during_backward():
    """Not one per gradient, each during backward (in the second step by the closers' hooks
    alone): with the default segments _model() is one, with HVDTRAIN_SEGMENT_BYTES=0 each
    gradient is its own."""
    from hvdtrain.torch import mpi_ops

    hvd.init()
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    names = []
    submit = mpi_ops._allreduce_async

    def counting(tensor, output, name, *args, **kwargs):
        names.append(name)
        return submit(tensor, output, name, *args, **kwargs)

    mpi_ops._allreduce_async = counting
    try:
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.ones(2, 7, dtype=torch.float64)).sum().backward()
            names.append("backward returned")
            optimizer.step()
    finally:
        mpi_ops._allreduce_async = submit
    if os.environ.get("HVDTRAIN_SEGMENT_BYTES") == "0":
        expected = ([f"DistributedOptimizer.{i}.{kind}" for i in (4, 2, 0) for kind in ("bias", "weight")]
                    + ["backward returned"]) * 2
    else:
        expected = ["DistributedOptimizer.0.weight..4.bias", "backward returned"] * 2
    assert names == expected, names
    hvd.shutdown()


def step_phases_keep_horovods_checks_of_misuse():
    """step() after synchronize() warns unless in skip_synchronize(), also where gradients came
    again in between; zero_grad() raises while gradients arrive, before synchronize() or after it.
    The first round has closers hooked until a second backward accumulates into the bucket
    views, the others every gradient."""
    hvd.init()
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    x = torch.ones(2, 7, dtype=torch.float64)

    def backward():
        model(x).sum().backward()

    def warns(action):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            action()
        return any("skip_synchronize" in str(w.message) for w in caught)

    def skipping_step():
        with optimizer.skip_synchronize():
            assert optimizer._should_synchronize is False
            optimizer.step()
        assert optimizer._should_synchronize is True

    hooks = []
    for k in range(3):
        optimizer.zero_grad()
        backward()
        assert not warns(optimizer.step), f"round {k}: a plain step warned"
        hooks.append(optimizer._hooks)

        optimizer.zero_grad()
        backward()
        with pytest.raises(AssertionError, match="zero_grad"):
            optimizer.zero_grad()
        optimizer.synchronize()
        assert warns(optimizer.step), f"round {k}: step() after synchronize() did not warn"

        optimizer.zero_grad()
        backward()
        optimizer.synchronize()
        assert not warns(skipping_step), f"round {k}: step() in skip_synchronize() warned"

        # Gradients again after synchronize(): zero_grad() refuses, step() still warns.
        optimizer.zero_grad()
        backward()
        optimizer.synchronize()
        optimizer.zero_grad()
        backward()
        with pytest.raises(AssertionError, match="zero_grad"):
            optimizer.zero_grad()
        assert warns(optimizer.step), f"round {k}: step() after synchronize() and backward did not warn"

        # skip_synchronize() forgets synchronize(), not the gradients that came after it:
        # zero_grad() refuses until synchronize().
        optimizer.zero_grad()
        backward()
        optimizer.synchronize()
        backward()
        assert not warns(skipping_step), f"round {k}: step() in skip_synchronize() warned"
        with pytest.raises(AssertionError, match="zero_grad"):
            optimizer.zero_grad()
        optimizer.synchronize()
        assert not warns(skipping_step), f"round {k}: step() in skip_synchronize() warned"
    assert hooks == [_Hooks.CLOSERS] + [_Hooks.EVERY_GRADIENT_FOR_GOOD] * 2, hooks
    hvd.shutdown()


def a_second_backward_raises_where_a_closer_deferred_its_segment():
    """With closers hooked, a second backward before step() raises Horovod's error also where the
    first one left its segment to synchronize(): the closer found the others' gradients missing."""
    hvd.init()
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    x = torch.ones(2, 7, dtype=torch.float64)
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    assert optimizer._hooks == _Hooks.CLOSERS, optimizer._hooks
    optimizer.zero_grad()
    # The first layer's gradients only, its closer's among them (backward reaches it last).
    model[0](x).sum().backward()
    assert optimizer._hooks == _Hooks.CLOSERS_UNTIL_SYNCHRONIZE, optimizer._hooks
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        model[0](x).sum().backward()
    optimizer.step()
    assert optimizer._hooks == _Hooks.EVERY_GRADIENT_FOR_GOOD, optimizer._hooks
    hvd.shutdown()


ALONE = [channels_last_gradients_keep_their_layout_in_the_bucket, a_step_submits_one_allreduce_per_segment_during_backward,
         step_phases_keep_horovods_checks_of_misuse, a_second_backward_raises_where_a_closer_deferred_its_segment]


@pytest.mark.parametrize("check", ALONE, ids=lambda check: check.__name__)
def test_a_job_of_one_rank_reduces_through_the_engine(ranks, check):
    ranks.alone(ALONE, env=ELASTIC_JOB).assert_passed(check)


def test_a_step_submits_one_allreduce_per_gradient_where_each_is_a_segment(ranks):
    ranks.alone([a_step_submits_one_allreduce_per_segment_during_backward],
                env={**ELASTIC_JOB, "HVDTRAIN_SEGMENT_BYTES": "0"}).assert_passed(
        a_step_submits_one_allreduce_per_segment_during_backward)
