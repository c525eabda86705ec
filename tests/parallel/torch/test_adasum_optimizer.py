"""hvdtrain.torch with op=Adasum on real ranks, at 2 and 4: allreduce and its gradient give
Adasum's tree; DistributedOptimizer(op=Adasum) moves every rank's weights by the Adasum of the
ranks' own optimizer updates, each rank keeping its own optimizer state (momentum), with one or
two backward passes a step, as a replay of every rank's optimizer in one process computes; and
Horovod's checks of misuse. At 3 ranks, where Adasum cannot run, the optimizer is refused when
made. The engine's Adasum itself is tested in tests/parallel/core/test_adasum.py."""

import numpy as np
import pytest
import torch
from support.adasum import adasum_reference

import hvdtrain.torch as hvd

STEPS = 3
BATCH = 4


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()


def _batch(rank, step, backward_pass):
    generator = torch.Generator().manual_seed(100 * step + 10 * backward_pass + rank)
    return torch.randn(BATCH, 5, generator=generator, dtype=torch.float64), torch.randn(BATCH, 2, generator=generator,
                                                                                        dtype=torch.float64)


def _loss(model, rank, step, backward_pass):
    inputs, targets = _batch(rank, step, backward_pass)
    return torch.nn.functional.mse_loss(model(inputs), targets)


def _replayed(world_size, passes):
    """The weights after STEPS steps, computed in one process: each rank's own copy of the model
    and of SGD with momentum takes a step on its own batches, and every copy is then set to its
    start plus the Adasum of the copies' changes."""
    models = [_model() for _ in range(world_size)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    for step in range(STEPS):
        starts = [[p.detach().clone() for p in m.parameters()] for m in models]
        for rank, (model, optimizer) in enumerate(zip(models, optimizers)):
            optimizer.zero_grad()
            for backward_pass in range(passes):
                _loss(model, rank, step, backward_pass).backward()
            optimizer.step()
        with torch.no_grad():
            for i, start in enumerate(starts[0]):
                deltas = [(list(m.parameters())[i] - s[i]).reshape(-1).numpy() for m, s in zip(models, starts)]
                combined = torch.from_numpy(adasum_reference(deltas)).reshape(start.shape)
                for model in models:
                    list(model.parameters())[i].copy_(start + combined)
    return [p.detach() for p in models[0].parameters()]


def the_optimizer_applies_the_adasum_of_each_ranks_own_update():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    for passes in (1, 2):
        model = _model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                             named_parameters=model.named_parameters(), op=hvd.Adasum,
                                             backward_passes_per_step=passes)
        for step in range(STEPS):
            optimizer.zero_grad()
            for backward_pass in range(passes):
                _loss(model, r, step, backward_pass).backward()
            optimizer.step()
        for got, expected in zip(model.parameters(), _replayed(n, passes)):
            torch.testing.assert_close(got.detach(), expected, rtol=1e-10, atol=1e-12)
        weights = hvd.allgather_object([p.detach().numpy().tobytes() for p in model.parameters()])
        assert all(w == weights[0] for w in weights), "the ranks' weights differ"
    hvd.shutdown()


def allreduce_and_its_gradient_give_adasums_tree():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    inputs = [torch.linspace(-1, 1, 6, dtype=torch.float64) * (k + 1) + torch.arange(6.0, dtype=torch.float64) ** k
              for k in range(n)]
    tensor = inputs[r].clone().requires_grad_()
    reduced = hvd.allreduce(tensor, op=hvd.Adasum)
    np.testing.assert_allclose(reduced.detach().numpy(), adasum_reference([x.numpy() for x in inputs]), rtol=1e-12)
    # As in Horovod, the gradient is the Adasum of the incoming gradients: equal ones, so themselves
    reduced.backward(torch.full((6,), 2.0, dtype=torch.float64))
    np.testing.assert_allclose(tensor.grad.numpy(), np.full(6, 2.0), rtol=1e-12)
    hvd.shutdown()


def horovods_checks_of_misuse_hold():
    hvd.init()
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                         named_parameters=model.named_parameters())
    _loss(model, hvd.rank(), 0, 0).backward()
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called after loss.backward\\(\\)"):
        optimizer.zero_grad()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step times"):
        _loss(model, hvd.rank(), 0, 1).backward()
    with pytest.raises(AssertionError, match="Skipping synchronization is not supported"):
        optimizer.skip_synchronize()
    optimizer.step()
    with pytest.raises(NotImplementedError, match="non-global process sets"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                 process_set=hvd.ProcessSet(range(hvd.size())))
    hvd.shutdown()


def three_ranks_are_refused_when_the_optimizer_is_made():
    hvd.init()
    model = _model()
    with pytest.raises(NotImplementedError, match="Adasum needs a power of two of ranks; this job has 3"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
    hvd.shutdown()


CHECKS = [the_optimizer_applies_the_adasum_of_each_ranks_own_update, allreduce_and_its_gradient_give_adasums_tree,
          horovods_checks_of_misuse_hold]


@pytest.mark.parametrize("num_proc", [2, 4])
@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_adasum(ranks, check, num_proc):
    ranks.run(num_proc, CHECKS, timeout=240).assert_passed(check)


def test_three_ranks_are_refused_when_the_optimizer_is_made(ranks):
    ranks.run(3, [three_ranks_are_refused_when_the_optimizer_is_made]).assert_passed(
        three_ranks_are_refused_when_the_optimizer_is_made)
