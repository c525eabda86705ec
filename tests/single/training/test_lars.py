"""LARS (hvdtrain/training/lars.py): its update step by step as the paper writes it, worked out by
hand; biases and BatchNorm's parameters excluded from the adaptation take plain momentum SGD; LR
changes with and without momentum correction; its state survives a checkpoint. On 2 ranks:
tests/parallel/training/test_lars.py."""

import io
import math

import pytest
import torch

from hvdtrain.run.config import typed
from hvdtrain.training.lars import LARS
from hvdtrain.training.train_torch import build_optimizer, _set_learning_rate

ETA, BETA, MOMENTUM, LR = 0.001, 0.01, 0.9, 2.0
EXCLUDED = ["0.bias", "1.bias", "1.weight", "3.bias"]  # the conv's and linear's biases, BatchNorm's


def lars_config(**options):
    return typed({"optimizer": {"name": "lars", "trust_coefficient": ETA, "weight_decay": BETA, "momentum": MOMENTUM,
                                **options}}).optimizer


def norm(vector):
    return math.hypot(*vector)


@pytest.mark.parametrize("nesterov", [False, True])
def test_two_steps_are_the_papers_worked_out_by_hand(nesterov):
    weight = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    optimizer = LARS([weight], lr=LR, momentum=MOMENTUM, weight_decay=BETA, trust_coefficient=ETA, nesterov=nesterov)
    w, v = [3.0, 4.0], [0.0, 0.0]
    for g in ([6.0, 8.0], [1.0, -2.0]):
        trust_ratio = ETA * norm(w) / (norm(g) + BETA * norm(w))  # 0.005 / 10.05 at the first step
        step = [trust_ratio * (gi + BETA * wi) for gi, wi in zip(g, w)]
        v = [MOMENTUM * vi + si for vi, si in zip(v, step)]
        update = [si + MOMENTUM * vi for si, vi in zip(step, v)] if nesterov else v
        w = [wi - LR * ui for wi, ui in zip(w, update)]

        weight.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
        assert weight.tolist() == pytest.approx(w, rel=1e-14)
        assert optimizer.state[weight]["momentum_buffer"].tolist() == pytest.approx(v, rel=1e-14)
    assert w[0] != pytest.approx(3.0)  # the steps moved the weights


@pytest.fixture
def excluded_trained():
    """A small conv net under LARS excluding biases and BatchNorm, with copies of the excluded
    parameters under torch's momentum SGD, both after the same 3 steps of random gradients:
    (model, optimizer, excluded parameters, their SGD copies, the two weights before)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(1, 3, 3), torch.nn.BatchNorm1d(3), torch.nn.Flatten(),
                                torch.nn.Linear(12, 2)).double()
    optimizer = build_optimizer(model, lars_config(exclude_from_adaptation=["bn", "bias"],
                                                    exclude_from_weight_decay=["bn", "bias"]), LR)
    excluded = [dict(model.named_parameters())[name] for name in EXCLUDED]
    copies = [p.detach().clone().requires_grad_() for p in excluded]
    weights_before = [model[0].weight.detach().clone(), model[3].weight.detach().clone()]
    sgd = torch.optim.SGD(copies, lr=LR, momentum=MOMENTUM, weight_decay=0.0, foreach=False)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        for p, copy in zip(excluded, copies):
            copy.grad = p.grad.clone()
        optimizer.step()
        sgd.step()
    return model, optimizer, excluded, copies, weights_before


def test_biases_and_batch_norm_go_to_a_group_without_adaptation_or_weight_decay(excluded_trained):
    model, optimizer, _, _, _ = excluded_trained
    names = {id(p): name for name, p in model.named_parameters()}
    groups = {(group["layer_adaptation"], group["weight_decay"]): sorted(names[id(p)] for p in group["params"])
              for group in optimizer.param_groups}
    assert groups == {(True, BETA): ["0.weight", "3.weight"], (False, 0.0): EXCLUDED}


def test_biases_and_batch_norm_take_plain_momentum_sgd(excluded_trained):
    _, _, excluded, copies, _ = excluded_trained
    for p, copy in zip(excluded, copies):
        assert torch.equal(p, copy)


def test_the_weights_move_by_a_fraction_of_their_norm_set_by_the_trust_ratio(excluded_trained):
    model, _, _, _, weights_before = excluded_trained
    # far less than SGD's steps here
    for before, after in zip(weights_before, [model[0].weight, model[3].weight]):
        assert 0 < (after - before).norm() < 10 * LR * ETA * before.norm()


@pytest.mark.parametrize("momentum_correction", [True, False])
def test_lr_changes_keep_or_rescale_the_momentum_as_the_setting_says(momentum_correction):
    """With the correction (the default) the LR multiplies the whole buffer at each step, as in
    torch's SGD; without it, train_torch rescales the buffer so that LARS is the paper's form, the
    LR inside the buffer: v <- m v + lr lambda (g + beta w); w <- w - v."""
    generator = torch.Generator().manual_seed(2)
    start = torch.randn(5, generator=generator, dtype=torch.float64)
    gradients = [torch.randn(5, generator=generator, dtype=torch.float64) for _ in range(5)]
    rates = [0.1, 0.1, 0.05, 0.2, 0.2]
    weight = start.clone().requires_grad_()
    optimizer = LARS([weight], lr=rates[0], momentum=MOMENTUM, weight_decay=BETA, trust_coefficient=ETA)
    w, v = start.clone(), torch.zeros(5, dtype=torch.float64)
    for lr, g in zip(rates, gradients):
        _set_learning_rate(optimizer, lr, momentum_correction)
        weight.grad = g
        optimizer.step()
        step = ETA * w.norm() / (g.norm() + BETA * w.norm()) * (g + BETA * w)
        if momentum_correction:
            v = MOMENTUM * v + step
            w = w - lr * v
        else:
            v = MOMENTUM * v + lr * step
            w = w - v
    torch.testing.assert_close(weight.detach(), w, rtol=1e-13, atol=0)


def test_its_state_goes_through_a_checkpoint():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2)).double()
    config = lars_config(exclude_from_adaptation=["bn", "bias"], nesterov=True)
    optimizer = build_optimizer(model, config, LR)
    inputs = torch.randn(8, 4, dtype=torch.float64)

    def train_step(model, optimizer):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()

    for _ in range(2):
        train_step(model, optimizer)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    state = torch.load(io.BytesIO(saved.getvalue()), weights_only=True)  # as checkpoints are read
    restored_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2)).double()
    restored_model.load_state_dict(state["model"])
    restored = build_optimizer(restored_model, config, 0.5)  # the LR too comes from the checkpoint
    restored.load_state_dict(state["optimizer"])
    for _ in range(2):
        train_step(model, optimizer)
        train_step(restored_model, restored)
    for p, q in zip(model.parameters(), restored_model.parameters()):
        assert torch.equal(p, q)
