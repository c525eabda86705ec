"""The check of a whole config (hvdtrain/run/config/__init__.py's `validate`): it names every
problem at once, and refuses what no section can, profile=true with dry_run=true."""

import pytest

from hvdtrain.run.config import ConfigError, validate

from support.configs import compose


def test_validation_lists_every_problem_at_once():
    cfg = compose("train.batch_size=0", "optimizer.momentum=1.5")
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert "train.batch_size=0" in str(error.value) and "optimizer.momentum=1.5" in str(error.value)


def test_a_profile_and_a_dry_run_at_once_are_refused():
    with pytest.raises(ConfigError) as refused:
        validate(compose("profile=true", "dry_run=true"))
    assert str(refused.value) == ("invalid config: profile=True: profile=true measures one device and dry_run=true "
                                  "prints the plan: run them one after the other")
