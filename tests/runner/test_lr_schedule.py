import math

import pytest
from omegaconf import OmegaConf

from hvdtrain.run.config.schedule import ScheduleConfig
from hvdtrain.run.config.schedule import learning_rate


def schedule(**values):
    return OmegaConf.structured(ScheduleConfig(**values))


def test_goyal_gradual_warmup_then_multistep():
    goyal = schedule(warmup_epochs=5, decay="multistep", milestones=[30, 60, 80], gamma=0.1)
    base, peak = 0.1, 3.2  # kn = 8k
    steps_per_epoch = 156
    warmup = [learning_rate(i / steps_per_epoch, goyal, base, peak, 90) for i in range(5 * steps_per_epoch + 1)]
    assert warmup[0] == base
    increments = {round(b - a, 12) for a, b in zip(warmup, warmup[1:])}
    assert increments == {round((peak - base) / (5 * steps_per_epoch), 12)}  # the same amount every iteration
    assert warmup[-1] == pytest.approx(peak)
    assert learning_rate(29.99, goyal, base, peak, 90) == peak
    assert learning_rate(30, goyal, base, peak, 90) == pytest.approx(0.32)
    assert learning_rate(60, goyal, base, peak, 90) == pytest.approx(0.032)
    assert learning_rate(85, goyal, base, peak, 90) == pytest.approx(0.0032)


def test_warmup_at_the_reference_batch_changes_nothing():
    assert learning_rate(0.5, schedule(warmup_epochs=5, decay="constant"), 0.1, 0.1, 90) == 0.1


def test_step_cosine_and_poly():
    assert learning_rate(65, schedule(decay="step", step_epochs=30, gamma=0.5), 0, 1.0, 90) == 0.25
    cosine = schedule(warmup_epochs=2, decay="cosine", final_lr=0.01)
    assert learning_rate(2, cosine, 0.1, 1.0, 12) == pytest.approx(1.0)
    assert learning_rate(7, cosine, 0.1, 1.0, 12) == pytest.approx(0.01 + 0.99 * 0.5)
    assert learning_rate(12, cosine, 0.1, 1.0, 12) == pytest.approx(0.01)
    poly = schedule(decay="poly", power=2.0)
    assert learning_rate(5, poly, 0.1, 1.0, 10) == pytest.approx(0.25)
    assert math.isclose(learning_rate(10, poly, 0.1, 1.0, 10), 0.0, abs_tol=1e-12)


def test_constant_warmup_holds_the_base_lr_then_jumps_and_none_starts_at_the_peak():
    """Goyal et al. section 2.2's three variants, with a decay that runs from the warmup's end."""
    constant = schedule(warmup="constant", warmup_epochs=5, decay="cosine")
    assert [learning_rate(p, constant, 0.1, 3.2, 90) for p in (0, 2.5, 4.999)] == [0.1, 0.1, 0.1]
    assert learning_rate(5, constant, 0.1, 3.2, 90) == pytest.approx(3.2)
    none = schedule(warmup="none", warmup_epochs=5, decay="cosine")
    assert learning_rate(0, none, 0.1, 3.2, 90) == pytest.approx(3.2)
    assert learning_rate(45, none, 0.1, 3.2, 90) == pytest.approx(1.6)  # half-way down: the cosine spans all 90
    gradual = schedule(warmup="gradual", warmup_epochs=5, decay="cosine")
    assert learning_rate(2.5, gradual, 0.1, 3.2, 90) == pytest.approx(1.65)
