"""The learning rate as the `schedule` section shapes it (hvdtrain/run/config/schedule.py): Goyal
et al.'s gradual warmup by the same amount every iteration, then their multistep decay; a warmup
at the reference batch changes nothing; step, cosine and poly decays; the constant and none
warmups; and a warmup the schedule does not know is refused by name."""

import math

import pytest
from omegaconf import OmegaConf

from hvdtrain.run.config import ConfigError, validate
from hvdtrain.run.config.schedule import ScheduleConfig, learning_rate

from support.configs import compose

GOYAL = dict(warmup_epochs=5, decay="multistep", milestones=[30, 60, 80], gamma=0.1)
BASE, PEAK = 0.1, 3.2  # kn = 8k
STEPS_PER_EPOCH = 156


def schedule(**values):
    return OmegaConf.structured(ScheduleConfig(**values))


def goyal_warmup():
    goyal = schedule(**GOYAL)
    return [learning_rate(i / STEPS_PER_EPOCH, goyal, BASE, PEAK, 90) for i in range(5 * STEPS_PER_EPOCH + 1)]


def test_gradual_warmup_starts_at_the_base_lr():
    assert goyal_warmup()[0] == BASE


def test_gradual_warmup_rises_by_the_same_amount_every_iteration():
    warmup = goyal_warmup()
    increments = {round(b - a, 12) for a, b in zip(warmup, warmup[1:])}
    assert increments == {round((PEAK - BASE) / (5 * STEPS_PER_EPOCH), 12)}


def test_gradual_warmup_ends_at_the_peak_lr():
    assert goyal_warmup()[-1] == pytest.approx(PEAK)


def test_multistep_decay_divides_by_ten_at_each_milestone():
    goyal = schedule(**GOYAL)
    assert learning_rate(29.99, goyal, BASE, PEAK, 90) == PEAK
    assert learning_rate(30, goyal, BASE, PEAK, 90) == pytest.approx(0.32)
    assert learning_rate(60, goyal, BASE, PEAK, 90) == pytest.approx(0.032)
    assert learning_rate(85, goyal, BASE, PEAK, 90) == pytest.approx(0.0032)


def test_warmup_at_the_reference_batch_changes_nothing():
    assert learning_rate(0.5, schedule(warmup_epochs=5, decay="constant"), 0.1, 0.1, 90) == 0.1


def test_step_decay_multiplies_by_gamma_every_step_epochs():
    assert learning_rate(65, schedule(decay="step", step_epochs=30, gamma=0.5), 0, 1.0, 90) == 0.25


def test_cosine_decay_runs_from_the_warmups_end_to_the_final_lr():
    cosine = schedule(warmup_epochs=2, decay="cosine", final_lr=0.01)
    assert learning_rate(2, cosine, 0.1, 1.0, 12) == pytest.approx(1.0)
    assert learning_rate(7, cosine, 0.1, 1.0, 12) == pytest.approx(0.01 + 0.99 * 0.5)
    assert learning_rate(12, cosine, 0.1, 1.0, 12) == pytest.approx(0.01)


def test_poly_decay_follows_its_power_to_zero():
    poly = schedule(decay="poly", power=2.0)
    assert learning_rate(5, poly, 0.1, 1.0, 10) == pytest.approx(0.25)
    assert math.isclose(learning_rate(10, poly, 0.1, 1.0, 10), 0.0, abs_tol=1e-12)


def test_constant_warmup_holds_the_base_lr_then_jumps_to_the_peak():
    """Goyal et al. section 2.2's three variants, with a decay that runs from the warmup's end."""
    constant = schedule(warmup="constant", warmup_epochs=5, decay="cosine")
    assert [learning_rate(p, constant, 0.1, 3.2, 90) for p in (0, 2.5, 4.999)] == [0.1, 0.1, 0.1]
    assert learning_rate(5, constant, 0.1, 3.2, 90) == pytest.approx(3.2)


def test_no_warmup_starts_at_the_peak_and_decays_over_all_epochs():
    none = schedule(warmup="none", warmup_epochs=5, decay="cosine")
    assert learning_rate(0, none, 0.1, 3.2, 90) == pytest.approx(3.2)
    assert learning_rate(45, none, 0.1, 3.2, 90) == pytest.approx(1.6)  # half-way down: the cosine spans all 90


def test_gradual_warmup_is_half_way_up_half_way_through():
    gradual = schedule(warmup="gradual", warmup_epochs=5, decay="cosine")
    assert learning_rate(2.5, gradual, 0.1, 3.2, 90) == pytest.approx(1.65)


def test_an_unknown_warmup_is_refused_with_the_key():
    with pytest.raises(ConfigError) as error:
        validate(compose("schedule.warmup=linear"))
    problem = "schedule.warmup='linear': allowed: gradual, constant, none"
    assert str(error.value).startswith(f"invalid config: {problem}") and "\n" not in str(error.value)
