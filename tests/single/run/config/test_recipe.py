"""The `recipe` section (hvdtrain/run/config/recipe.py): a recipe's reference throughput, from
which the plan predicts, must be a throughput."""

import pytest

from hvdtrain.run.config import ConfigError, validate

from support.configs import compose


def test_a_reference_throughput_of_zero_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as refused:
        validate(compose("recipe=vgg16_synthetic", "recipe.reference_throughput.samples_per_s=0"))
    assert str(refused.value) == ("invalid config: recipe.reference_throughput.samples_per_s=0.0: must be a positive "
                                  "throughput of one device")
