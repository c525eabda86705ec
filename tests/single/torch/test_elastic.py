"""hvdtrain.torch's elastic TorchState without hvdtrun (hvdtrain/torch/elastic/): commits stay
in memory, restore undoes what came after the last one, in place for every model and optimizer,
and a state's saved bytes load into another. ElasticSampler, which needs ranks, and the states'
sync: tests/parallel/test_torch.py. Under hvdtrun: tests/integration/launch/hvdtrun/test_elastic.py."""

import pytest
import torch

import hvdtrain.torch as hvd


@pytest.fixture
def committed():
    """(a TorchState committed at epoch 0, the model's weights then); the weights and the epoch
    have changed since."""
    model = torch.nn.Linear(2, 1)
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=0)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.epoch = 5
    return state, weights


def test_restore_undoes_what_came_after_the_commit(committed):
    state, weights = committed
    state.restore()
    assert state.epoch == 0
    for name, value in state.model.state_dict().items():
        assert torch.equal(value, weights[name])


def test_a_states_saved_bytes_load_into_another_state(committed):
    state, weights = committed
    state.restore()
    copy = hvd.elastic.TorchState(torch.nn.Linear(2, 1), torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1),
                                  epoch=3)
    copy.load_saved_bytes(state.saved_bytes())
    assert copy.epoch == 0 and torch.equal(copy.model.weight, weights["weight"])


def test_every_model_and_optimizer_is_restored_in_place_whatever_its_name():
    generator, discriminator = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(discriminator.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(generator=generator, discriminator=discriminator, d_optimizer=optimizer)
    committed = {name: value.clone() for name, value in discriminator.state_dict().items()}
    discriminator(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    state.restore()
    assert state.discriminator is discriminator and state.d_optimizer is optimizer
    for name, value in discriminator.state_dict().items():
        assert torch.equal(value, committed[name])
    assert optimizer.state_dict()["state"] == {}  # the momentum of the step after the commit is gone


def scheduled(optimizer_class=torch.optim.SGD):
    """(a TorchState of a model, an optimizer of `optimizer_class` and its LR scheduler, committed
    at the scheduler's epoch 0; the scheduler has stepped twice since)."""
    model = torch.nn.Linear(2, 1)
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, optimizer, scheduler=scheduler)
    state.commit()
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    return state


def test_an_lr_scheduler_is_restored_in_place_with_its_optimizers_rate():
    state = scheduled()
    scheduler = state.scheduler
    state.restore()
    assert state.scheduler is scheduler and scheduler.optimizer is state.optimizer
    assert scheduler.last_epoch == 0 and state.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_the_scheduler_of_an_optimizer_whose_class_does_not_pickle_is_saved_for_a_restart():
    # as the DistributedOptimizer's class, made for the optimizer it wraps
    state = scheduled(type("SGD", (torch.optim.SGD,), {}))
    fresh = scheduled()
    fresh.load_saved_bytes(state.saved_bytes())
    assert fresh.scheduler.last_epoch == 0 and fresh.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_an_attribute_that_cannot_be_saved_for_a_restart_is_named():
    model = torch.nn.Linear(2, 1)
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), report=lambda: None)
    with pytest.raises(TypeError, match=r"the state's 'report' \(function\) cannot be kept across a restart"):
        state.saved_bytes()


def test_horovods_module_paths_name_the_same_classes():
    from hvdtrain.torch.elastic.sampler import ElasticSampler
    from hvdtrain.torch.elastic.state import ObjectState, TorchState

    assert (ElasticSampler, TorchState, ObjectState) == \
        (hvd.elastic.ElasticSampler, hvd.elastic.TorchState, hvd.elastic.ObjectState)
