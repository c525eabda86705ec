"""DistributedOptimizer: N ranks x batch b train exactly like one process with batch N*b."""

import os

import pytest
import torch

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


def ranks_equivalence():
    import hvdtrain.torch as hvd

    hvd.init()
    for passes, set_to_none in ((1, True), (2, True), (2, False)):
        _check_equivalence(hvd, passes, set_to_none)


def _check_equivalence(hvd, passes, set_to_none):
    n, r = hvd.size(), hvd.rank()

    reference = _model()
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    # One process, one batch of all the step's samples.
    expected = _train(reference, reference_opt, _batches(n, passes), lambda x, y, p: (x, y), 1)

    model = _model()
    from hvdtrain.torch.optimizer import HUGE_PAGE_BYTES

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


@pytest.mark.parametrize("num_proc", [2, 3, 4])
def test_matches_single_process_large_batch(mpirun, num_proc):
    """For backward_passes_per_step 1 and 2, and gradients zeroed rather than set to None."""
    mpirun(num_proc, ranks_equivalence, timeout=180)


@pytest.mark.parametrize("segment_bytes", ["0", "20000"])
def test_matches_large_batch_whatever_the_segments(mpirun, segment_bytes):
    """Each gradient on its own (Horovod's way), and segments that split the model unevenly;
    the default puts this model in one."""
    mpirun(3, ranks_equivalence, timeout=180, env={"HVDTRAIN_SEGMENT_BYTES": segment_bytes})


def ranks_closers_stay_right():
    """From the second step only each segment's closer has a hook. The result stays the large
    batch's where backward's order changes, where gradients are not set to None (so that they
    accumulate over steps), and with each gradient on its own."""
    import hvdtrain.torch as hvd
    from hvdtrain.torch.optimizer import _Hooks

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    generator = torch.Generator().manual_seed(2)
    data = torch.randn(5, n * PER_RANK_BATCH, 5, generator=generator, dtype=torch.float64)
    scenarios = {  # name: (backward's order of the layers each step, zero_grad before each step)
        "order changes": ([[0, 1, 2], [0, 1, 2], [2, 0, 1], [0, 1, 2], [0, 1, 2]], [True] * 5),
        "order changes, not set to None": ([[0, 1, 2], [0, 1, 2], [2, 0, 1], [0, 1, 2], [0, 1, 2]],
                                           [True, True, False, True, True]),
    }
    for name, (orders, zeroing) in scenarios.items():
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


@pytest.mark.parametrize("segment_bytes", [None, "0"])
def test_closing_gradients_alone_keep_the_large_batch_result(mpirun, segment_bytes):
    mpirun(3, ranks_closers_stay_right, timeout=180,
           env={} if segment_bytes is None else {"HVDTRAIN_SEGMENT_BYTES": segment_bytes})


def ranks_grouped_and_compressed():
    """groups and Compression.fp16 change how gradients travel, not the average they give."""
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    reference = _model()
    for k in range(n):
        reference(torch.full((4, 7), float(k + 1), dtype=torch.float64)).sum().backward()
    expected = [p.grad / n for p in reference.parameters()]
    for options, tolerance in [({"groups": 2}, 1e-12), ({"groups": "first and last"}, 1e-12),
                               ({"compression": hvd.Compression.fp16}, 2e-3)]:
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


def test_groups_and_compression_average_alike(mpirun):
    mpirun(3, ranks_grouped_and_compressed, timeout=180)


def test_segments_follow_backward_order_and_size():
    """Runs of about segment_bytes from the last parameter back, within one bucket; groups as
    given, other parameters alone; 0 puts each parameter on its own."""
    from hvdtrain.torch.optimizer import _GradientBuckets, _segment_members

    sizes = [10, 300, 20, 500, 40, 60]  # float32 elements
    params = [torch.nn.Parameter(torch.zeros(k)) for k in sizes]
    params.insert(3, torch.nn.Parameter(torch.zeros(7, dtype=torch.float64)))  # another bucket
    buckets = _GradientBuckets(params, "test")
    index = {p: i for i, p in enumerate(params)}

    def segments(groups=None, segment_bytes=0):
        return [[index[p] for p in members] for members in _segment_members(params, buckets, groups, segment_bytes)]

    assert segments(segment_bytes=1000) == [[6, 5, 4], [3], [2, 1], [0]]
    assert segments(segment_bytes=0) == [[6], [5], [4], [3], [2], [1], [0]]
    assert segments(segment_bytes=1 << 20) == [[6, 5, 4], [3], [2, 1, 0]]
    assert segments(groups={params[0]: 0, params[5]: 0, params[2]: 1}) == [[0, 5], [2], [1], [3], [4], [6]]


def ranks_optimizer_behaviour():
    import hvdtrain.torch as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()

    # Gradient clipping between synchronize() and step(), as Horovod documents it.
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    x = torch.full((4, 7), float(r + 1), dtype=torch.float64)
    model(x).sum().backward()
    optimizer.synchronize()
    averaged = [p.grad.clone() for p in model.parameters()]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with optimizer.skip_synchronize():
        optimizer.step()
    # The averaged gradient equals the gradient at the mean of the ranks' inputs' gradients.
    reference = _model()
    for k in range(n):
        reference(torch.full((4, 7), float(k + 1), dtype=torch.float64)).sum().backward()
    for got, ref in zip(averaged, reference.parameters()):
        assert torch.allclose(got, ref.grad / n, atol=1e-12), "synchronize() did not average gradients"

    # zero_grad() between backward and step is a race Horovod forbids.
    optimizer.zero_grad()
    model(x).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.step()

    # A second backward before step() with backward_passes_per_step=1 is an error.
    optimizer.zero_grad()
    model(x).sum().backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        model(x).sum().backward()
    optimizer.step()

    # A parameter used on some ranks only (a dynamic graph) still gets the average, with
    # zeros from ranks that did not use it; model.zero_grad(set_to_none=True) is respected.
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

    # Sparse gradients (nn.Embedding(sparse=True)) are averaged like their dense equivalents.
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

    # Bad named_parameters.
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("w", p) for p in model.parameters()])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=list(model.named_parameters())[:1])


def test_optimizer_behaviour(mpirun):
    mpirun(3, ranks_optimizer_behaviour, timeout=180)


def ranks_process_sets():
    """Two pairs of ranks train two models side by side, each pair data-parallel within itself."""
    import hvdtrain.torch as hvd

    pairs = [hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])]
    hvd.init(process_sets=pairs)
    r = hvd.rank()
    mine = pairs[r // 2]
    position = mine.rank()

    def pair_batches():  # each pair its own data
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

    # Gradients through the collectives stay within the set: allgather's backward takes this
    # rank's rows at its position in the set, reducescatter's (Sum) multiplies by the set's size.
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


def test_process_sets_train_side_by_side_each_like_its_own_large_batch(mpirun):
    mpirun(4, ranks_process_sets, timeout=180)


def _anon_huge_page_kib(address):
    """AnonHugePages of the mapping of this process that holds `address`."""
    inside = False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = start <= address < end
        elif inside and fields[0] == "AnonHugePages:":
            return int(fields[1])
    raise AssertionError(f"no mapping holds address {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_gradient_bucket_is_zeroed_and_on_huge_pages(dtype):
    from hvdtrain.torch.optimizer import HUGE_PAGE_BYTES, _huge_page_zeros

    numel = 3 * (1 << 20) + 5  # 6 to 24 MB, several huge pages
    bucket = _huge_page_zeros(numel, dtype)
    assert bucket.dtype == dtype and bucket.shape == (numel,) and bucket.is_contiguous()
    assert torch.count_nonzero(bucket) == 0
    bucket.fill_(1)  # touch every page
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read() if os.path.exists(
        "/sys/kernel/mm/transparent_hugepage/enabled") else "[never]"
    if "[never]" in thp:
        pytest.skip("transparent huge pages are disabled on this machine")
    # MPI reduces gradients 1.3x as fast from huge pages (README); torch.zeros gets none here.
    # Every whole huge page of the bucket is one.
    assert bucket.data_ptr() % HUGE_PAGE_BYTES == 0
    whole_pages_kib = bucket.numel() * bucket.element_size() // HUGE_PAGE_BYTES * (HUGE_PAGE_BYTES >> 10)
    assert _anon_huge_page_kib(bucket.data_ptr()) >= whole_pages_kib


# An elastic job's world may grow, so Horovod's DistributedOptimizer reduces in it even at one
# rank, as ours does: these tests run one process and still go through the engine.
ELASTIC_JOB = {"HOROVOD_ELASTIC": "1"}


def alone_channels_last():
    """HOROVOD_ELASTIC=1: a job of one rank reduces through the engine; a channels_last
    model's gradients keep its layout in the bucket, without autograd's layout warning, and the
    step is plain SGD's."""
    import warnings

    import hvdtrain.torch as hvd

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
    print("channels_last ok")


def alone_submissions_per_step():
    """A step submits one allreduce per segment's run, not one per gradient, each during backward
    (in the second step by the closers' hooks alone)."""
    import hvdtrain.torch as hvd
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
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(2, 7, dtype=torch.float64)).sum().backward()
        names.append("backward returned")
        optimizer.step()
    print("submitted", names)


@pytest.mark.parametrize("segment_bytes, expected", [
    (None, ["DistributedOptimizer.0.weight..4.bias", "backward returned"] * 2),
    ("0", ([f"DistributedOptimizer.{i}.{kind}" for i in (4, 2, 0) for kind in ("bias", "weight")]
           + ["backward returned"]) * 2),
])
def test_a_step_submits_one_allreduce_per_run(alone, segment_bytes, expected):
    env = dict(ELASTIC_JOB)
    if segment_bytes is not None:
        env["HVDTRAIN_SEGMENT_BYTES"] = segment_bytes
    result = alone(alone_submissions_per_step, env=env)
    assert f"submitted {expected}" in result.stdout, result.stdout


def test_channels_last_gradients_keep_their_layout_in_the_bucket(alone):
    result = alone(alone_channels_last, env=ELASTIC_JOB)
    assert "channels_last ok" in result.stdout, result.stdout


def alone_step_phases():
    """Horovod's checks of misuse, through the step's phases: step() after synchronize() warns
    unless in skip_synchronize(), also where gradients came again in between; zero_grad() raises
    while gradients arrive, before synchronize() or after it. The first round has closers hooked
    until a second backward accumulates into the bucket views, the others every gradient."""
    import warnings

    import hvdtrain.torch as hvd
    from hvdtrain.torch.optimizer import _Hooks

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
    print("phases ok")


def test_step_phases_keep_horovods_checks_of_misuse(alone):
    result = alone(alone_step_phases, env=ELASTIC_JOB)
    assert "phases ok" in result.stdout, result.stdout


def alone_second_backward_with_a_deferred_segment():
    """With closers hooked, a second backward before step() raises Horovod's error also where the
    first one left its segment to synchronize(): the closer found the others' gradients missing."""
    import hvdtrain.torch as hvd
    from hvdtrain.torch.optimizer import _Hooks

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
    print("deferred ok")


def test_a_second_backward_raises_where_a_closer_deferred_its_segment(alone):
    result = alone(alone_second_backward_with_a_deferred_segment, env=ELASTIC_JOB)
    assert "deferred ok" in result.stdout, result.stdout
