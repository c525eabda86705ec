"""The `cluster` section's numbers (hvdtrain/run/config/cluster.py): a layout of no hosts or no
slots, and links of no bandwidth or a negative latency, are refused naming the key."""

import pytest

from hvdtrain.run.config import ConfigError, validate

from support.configs import compose


@pytest.mark.parametrize("overrides, problem", [
    (["cluster=0x4"], "cluster.num_hosts=0: must be at least 1"),
    (["cluster=3x0"], "cluster.slots=0: must be at least 1 rank per host"),
    (["cluster.network.latency_us=-0.5"], "cluster.network.latency_us=-0.5: must be microseconds (0 or more) or null"),
    (["cluster.network.within_gbps=0"], "cluster.network.within_gbps=0.0: must be a positive Gbit/s or null"),
    (["cluster.network.within_latency_us=-1"],
     "cluster.network.within_latency_us=-1.0: must be microseconds (0 or more) or null"),
])
def test_a_layout_or_link_that_cannot_be_is_refused_naming_the_key(overrides, problem):
    with pytest.raises(ConfigError) as refused:
        validate(compose(*overrides))
    assert str(refused.value) == f"invalid config: {problem}"
