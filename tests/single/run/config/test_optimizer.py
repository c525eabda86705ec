"""The `optimizer` section (hvdtrain/run/config/optimizer.py): SGD or LARS, LARS's keys refused
with the key where they cannot run (another optimizer, another framework, another kind of
parameter) and set by optimizer=lars where not given."""

import pytest

from hvdtrain.run.config import ConfigError, validate

from support.configs import compose

REFUSED = {
    "an unknown optimizer": (["optimizer.name=adam"], "optimizer.name='adam': allowed: sgd, lars"),
    "LARS without a trust coefficient": (["optimizer=lars", "optimizer.trust_coefficient=null"],
                                         "optimizer.trust_coefficient=None: must be a positive number"),
    "LARS with tensorflow": (["optimizer=lars", "recipe.framework=tensorflow"],
                             "optimizer.name='lars': LARS is implemented for recipe.framework=torch only"),
    "a LARS key with SGD": (["optimizer.trust_coefficient=0.001"],
                            "optimizer.trust_coefficient=0.001: applies to optimizer=lars only"),
    "an adaptation exclusion with SGD": (["optimizer.exclude_from_adaptation=[bn]"],
                                         "optimizer.exclude_from_adaptation=['bn']: applies to optimizer=lars only"),
    "an unknown kind of parameter": (["optimizer=lars", "optimizer.exclude_from_adaptation=[norm]"],
                                     "optimizer.exclude_from_adaptation=['norm']: allowed entries: bn, bias"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_optimizer_values_that_cannot_run_are_refused_with_the_key(case):
    overrides, problem = REFUSED[case]
    with pytest.raises(ConfigError) as error:
        validate(compose(*overrides))
    assert str(error.value).startswith(f"invalid config: {problem}") and "\n" not in str(error.value)


def test_optimizer_lars_sets_the_papers_trust_coefficient_and_exclusions():
    cfg = compose("data=mnist1d", "model=mnist1d_mlp", "optimizer=lars")
    validate(cfg)
    assert (cfg.optimizer.name, cfg.optimizer.trust_coefficient) == ("lars", 0.001)
    assert list(cfg.optimizer.exclude_from_adaptation) == ["bn", "bias"]
    assert list(cfg.optimizer.exclude_from_weight_decay) == ["bn", "bias"]
