"""No host sync per step for the progress report (hvdtrain/reporting/progress.py): a step's loss
stays where the framework left it (on a GPU, reading it waits for the GPU), and the report reads
the window's sum only when it records, every train.log_every_steps steps and at each epoch's end.
That train_torch leaves its loss unread: tests/single/training/test_train_torch.py."""

import types

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
def epoch_reported(monkeypatch, tmp_path):
    """An epoch of 10 steps of half a second reported on one rank, logging every 4 steps: (the
    report, the reads of the losses after step 3, all reads)."""
    monkeypatch.setattr(progress, "core", types.SimpleNamespace(rank=lambda: 0, size=lambda: 1))
    monkeypatch.setenv("HVDTRAIN_PROGRESS_BAR", "0")
    cfg = compose("train.log_every_steps=4")
    plan = make_plan(cfg, [Host("localhost", 1)], CPU, train_size=320)  # 10 steps an epoch
    report = progress.Progress(cfg, plan, tmp_path, checkpoint.fresh_start(), session_start=0.0)
    reads, after_step_3 = [], None
    for step in range(10):
        mean = report.step_done(step, step + 1, DeviceLoss(float(step), reads), seconds=0.5)
        if mean is not None:  # the loop averages it over the ranks: one rank's is the average
            report.record(0, step, step + 1, 0.1, mean)
        if step == 3:
            after_step_3 = list(reads)
    return report, after_step_3, reads


def test_the_loss_is_read_once_at_the_first_record_as_the_windows_sum(epoch_reported):
    _, after_step_3, _ = epoch_reported
    assert after_step_3 == [0 + 1 + 2 + 3]


def test_the_loss_is_read_only_when_it_is_recorded(epoch_reported):
    _, _, reads = epoch_reported
    assert reads == [6.0, 4 + 5 + 6 + 7, 8 + 9]  # steps 4 and 8, and the epoch's end


def test_the_train_loss_is_the_last_windows_mean(epoch_reported):
    report, _, _ = epoch_reported
    assert report.train_loss == pytest.approx((8 + 9) / 2)


def test_the_training_time_adds_up_the_steps(epoch_reported):
    report, _, _ = epoch_reported
    assert report.train_s() == pytest.approx(5.0, abs=0.01)
