"""LARS wrapped in hvdtrain.torch's DistributedOptimizer on 2 real ranks trains as one process
on the whole batch (hvdtrain/training/lars.py)."""

import functools

import pytest
import torch

from hvdtrain.run.config import typed
from hvdtrain.training.lars import LARS
from hvdtrain.training.train_torch import build_optimizer

ETA, BETA, MOMENTUM, LR = 0.001, 0.01, 0.9, 2.0


def lars_config(**options):
    return typed({"optimizer": {"name": "lars", "trust_coefficient": ETA, "weight_decay": BETA, "momentum": MOMENTUM,
                                **options}}).optimizer


STEPS, PER_RANK_BATCH = 4, 6


@functools.cache
def lars_on_ranks():
    """(the model trained on this rank's part of every batch under LARS wrapped in the
    DistributedOptimizer, the wrapped optimizer, the same model trained in this process on the
    whole batches), trained once a job for all the checks that read them."""
    import hvdtrain.torch as hvd

    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    config = lars_config(exclude_from_adaptation=["bias"], exclude_from_weight_decay=["bias"])

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()

    def batches():
        generator = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            rows = size * PER_RANK_BATCH
            yield (torch.randn(rows, 7, generator=generator, dtype=torch.float64),
                   torch.randint(0, 3, (rows,), generator=generator))

    def train(model, optimizer, part):
        for inputs, targets in batches():
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs[part]), targets[part]).backward()
            optimizer.step()

    reference = model()
    train(reference, build_optimizer(reference, config, LR), slice(None))

    distributed = model()
    optimizer = hvd.DistributedOptimizer(build_optimizer(distributed, config, LR),
                                         named_parameters=distributed.named_parameters())
    train(distributed, optimizer, slice(rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH))
    return distributed, optimizer, reference


def the_wrapped_optimizer_is_still_lars():
    _, optimizer, _ = lars_on_ranks()
    assert isinstance(optimizer, LARS)


def two_ranks_train_as_one_process_on_the_whole_batch():
    import hvdtrain.torch as hvd

    distributed, _, reference = lars_on_ranks()
    for got, expected in zip(distributed.parameters(), reference.parameters()):
        assert (got - expected).abs().max().item() < 1e-12, f"rank {hvd.rank()}: not the whole batch's update"


def the_ranks_end_with_the_same_weights():
    import hvdtrain.torch as hvd

    distributed, _, _ = lars_on_ranks()
    for got in distributed.parameters():
        gathered = hvd.allgather(got.detach().unsqueeze(0))
        assert torch.equal(gathered, got.detach().unsqueeze(0).expand_as(gathered)), "the ranks disagree"


CHECKS = [the_wrapped_optimizer_is_still_lars, two_ranks_train_as_one_process_on_the_whole_batch,
          the_ranks_end_with_the_same_weights]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_lars_in_the_distributed_optimizer_on_two_ranks(ranks, check):
    ranks.run(2, CHECKS, timeout=120).assert_passed(check)
