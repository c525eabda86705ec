"""No host sync per step for the progress report: a step's loss stays where the framework left
it (on a GPU, reading it waits for the GPU), and the report reads the window's sum only when it
records, every train.log_every_steps steps and at each epoch's end."""

import contextlib
import types

import numpy as np
import pytest

from hvdtrain.reporting import progress
from hvdtrain.run.devices import CPU
from hvdtrain.run.hosts import Host
from hvdtrain.run.plan import make_plan
from hvdtrain.training import checkpoint

from support.configs import compose


class DeviceLoss:
    """A loss still on its device: it adds up without being read, and counts the reads."""

    def __init__(self, value, reads):
        self.value, self.reads = value, reads

    def __add__(self, other):
        return DeviceLoss(self.value + (other.value if isinstance(other, DeviceLoss) else other), self.reads)

    __radd__ = __add__

    def __float__(self):
        self.reads.append(self.value)
        return float(self.value)

    def item(self):
        return self.__float__()


@pytest.fixture
def one_rank(monkeypatch):
    """The core of a job of one rank, as far as the progress report uses it."""
    core = types.SimpleNamespace(rank=lambda: 0, size=lambda: 1)
    monkeypatch.setattr(progress, "core", core)


def test_the_loss_is_read_only_when_it_is_recorded(one_rank, tmp_path, monkeypatch):
    monkeypatch.setenv("HVDTRAIN_PROGRESS_BAR", "0")
    cfg = compose("train.log_every_steps=4")
    plan = make_plan(cfg, [Host("localhost", 1)], CPU, train_size=320)  # 10 steps an epoch
    report = progress.Progress(cfg, plan, tmp_path, checkpoint.fresh_start(), session_start=0.0)
    reads = []
    for step in range(10):
        mean = report.step_done(step, step + 1, DeviceLoss(float(step), reads), seconds=0.5)
        if mean is not None:  # the loop averages it over the ranks: one rank's is the average
            report.record(0, step, step + 1, 0.1, mean)
        if step == 3:
            assert reads == [0 + 1 + 2 + 3], "read once, at the first record, as the window's sum"
    assert reads == [6.0, 4 + 5 + 6 + 7, 8 + 9]  # steps 4 and 8, and the epoch's end
    assert report.train_loss == pytest.approx((8 + 9) / 2)
    assert report.train_s() == pytest.approx(5.0, abs=0.01)


def test_a_torch_step_leaves_its_loss_on_the_device(monkeypatch):
    """train_torch._train_step returns the mean loss as a tensor it has not read."""
    import torch

    from hvdtrain.training.train_torch import ToDevice, _train_step

    class Optimizer(torch.optim.SGD):  # the DistributedOptimizer's protocol, on one process
        def synchronize(self):
            pass

        def skip_synchronize(self):
            return contextlib.nullcontext()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = Optimizer(model.parameters(), lr=0.1)
    batches = iter([(torch.randn(2, 4), torch.tensor([0, 2])), (torch.randn(2, 4), torch.tensor([1, 1]))])
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    def no_reading(*args):
        raise AssertionError("the loss was read")

    with monkeypatch.context() as patched:
        for name in ("item", "__float__", "tolist", "numpy"):
            patched.setattr(torch.Tensor, name, no_reading)
        loss = _train_step(model, optimizer, scaler, batches, 2, ToDevice(torch.device("cpu"), False), "none")
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0 and not loss.requires_grad
    assert np.isfinite(float(loss))
