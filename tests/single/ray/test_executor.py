"""hvdtrain.ray's RayExecutor without a Ray cluster: the elastic executor's arguments (refused with
one line naming the argument, as Horovod refuses them) and the hosts it finds in Ray's nodes or in
a discovery of the caller's. Its runs on a real cluster: tests/cluster/test_ray.py and
test_ray_elastic.py."""

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'hvdtrain[ray]')")

from hvdtrain.ray import ElasticRayExecutor, RayExecutor, RaySettings  # noqa: E402
from hvdtrain.ray import executor as executor_module  # noqa: E402
from hvdtrain.run.hosts import Host  # noqa: E402


def test_min_workers_makes_an_elastic_executor_with_the_loops_options():
    executor = RayExecutor(RaySettings(), min_workers=2, max_workers=4, reset_limit=3, cooldown_range=[5, 60],
                           elastic_timeout=90, cpus_per_worker=2)
    options = executor.elastic
    assert (options.min_np, options.max_np, options.reset_limit, options.elastic_timeout_s,
            options.blacklist_cooldown_s) == (2, 4, 3, 90, (5, 60))
    assert options.terms.launcher == "hvdtrain.ray" and options.terms.min_np == "min_workers"


def test_a_static_executor_has_no_elastic_options():
    assert RayExecutor(RaySettings(), num_workers=2).elastic is None


@pytest.mark.parametrize("arguments, message", [
    (dict(min_workers=2, num_workers=4), r"give min_workers \(an elastic job\) or num_workers/num_hosts, not both"),
    (dict(max_workers=4), r"min_workers must be a positive integer, got None"),
    (dict(min_workers=0), r"min_workers must be a positive integer, got 0"),
    (dict(min_workers=3, max_workers=2), r"max_workers must be an integer of at least min_workers 3, got 2"),
    (dict(min_workers=1, reset_limit=-1), r"reset_limit must be an integer of at least 0, got -1"),
    (dict(min_workers=1, cooldown_range=[10, 5]), r"cooldown_range \[10, 5\]: the low must be positive"),
    (dict(min_workers=1, elastic_timeout=0), r"elastic_timeout must be a positive number of seconds, got 0"),
])
def test_bad_elastic_arguments_are_refused_naming_the_argument(arguments, message):
    with pytest.raises(ValueError, match=message):
        RayExecutor(RaySettings(), **arguments)


class HostsOfTheCallers:
    """A discovery of the caller's own, as Horovod's HostDiscovery."""

    def find_available_hosts_and_slots(self):
        return {"10.0.0.2": 2, "10.0.0.1": 1, "10.0.0.3": 0}


def test_without_override_discovery_the_hosts_are_the_settings_discoverys_with_slots():
    settings = RaySettings(discovery=HostsOfTheCallers())
    executor = RayExecutor(settings, min_workers=1, override_discovery=False)
    assert executor.elastic.discovery() == [Host("10.0.0.1", 1), Host("10.0.0.2", 2)]
    assert executor.elastic.terms.discovered == "settings.discovery found"


def test_horovods_elastic_settings_carry_their_discovery_to_the_executor():
    settings = ElasticRayExecutor.create_settings(min_num_proc=1)
    settings.discovery = HostsOfTheCallers()  # as Horovod's examples set it
    executor = ElasticRayExecutor(settings, override_discovery=False)._executor
    assert executor.elastic.discovery() == [Host("10.0.0.1", 1), Host("10.0.0.2", 2)]


def test_without_override_discovery_settings_without_a_discovery_are_refused():
    with pytest.raises(ValueError, match=r"override_discovery=False needs settings.discovery, an object with "
                                         r"find_available_hosts_and_slots\(\).*got None"):
        RayExecutor(RaySettings(), min_workers=1, override_discovery=False)


@pytest.mark.parametrize("call", ["run_remote", "execute_single"])
def test_an_elastic_executor_refuses_calls_its_short_lived_workers_cannot_serve(call):
    executor = RayExecutor(RaySettings(), min_workers=1)
    with pytest.raises(NotImplementedError, match=f"an elastic RayExecutor has no {call}"):
        getattr(executor, call)(lambda *args: None)


def test_an_elastic_run_before_start_is_refused():
    with pytest.raises(RuntimeError, match=r"call start\(\) before running functions"):
        RayExecutor(RaySettings(), min_workers=1).run(lambda: None)


def test_run_remote_refuses_callbacks_it_could_not_call():
    with pytest.raises(NotImplementedError, match="run_remote returns before the ranks log anything"):
        RayExecutor(RaySettings(), num_workers=2).run_remote(lambda: None, callbacks=[print])


def node(address, cpus, gpus=0, alive=True):
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return {"NodeManagerAddress": address, "Alive": alive, "Resources": resources}


def test_the_hosts_are_the_alive_nodes_with_as_many_slots_as_workers_fit(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [node("10.0.0.3", 8), node("10.0.0.1", 3),
                                               node("10.0.0.2", 16, alive=False), node("10.0.0.4", 1)])
    assert executor_module.ray_hosts(cpus_per_worker=2, gpus_per_worker=0) == [Host("10.0.0.1", 1), Host("10.0.0.3", 4)]


def test_with_gpus_a_nodes_slots_are_what_both_its_cpus_and_gpus_fit(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [node("10.0.0.1", 32, gpus=4), node("10.0.0.2", 2, gpus=8),
                                               node("10.0.0.3", 32)])
    assert executor_module.ray_hosts(cpus_per_worker=1, gpus_per_worker=1) == [Host("10.0.0.1", 4), Host("10.0.0.2", 2)]


def test_horovods_elastic_ray_executor_is_the_elastic_executor_with_its_settings():
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=6, reset_limit=1, elastic_timeout=60,
                                                  timeout_s=45, verbose=True)
    options = ElasticRayExecutor(settings, cpus_per_slot=2)._executor.elastic
    assert (options.min_np, options.max_np, options.reset_limit, options.elastic_timeout_s) == (2, 6, 1, 60)


def test_elastic_ray_settings_take_horovods_deprecated_names_with_its_warning():
    with pytest.warns(DeprecationWarning, match="min_np is deprecated, use min_num_proc instead"):
        settings = ElasticRayExecutor.create_settings(min_np=3)
    assert settings.min_num_proc == 3


def test_elastic_ray_settings_refuse_what_they_do_not_take():
    with pytest.raises(ValueError, match="create_settings does not take gloo_timeout_seconds"):
        ElasticRayExecutor.create_settings(gloo_timeout_seconds=30)
