"""The plan's prediction (hvdtrain/scaling/prediction.py): without the network or one device's
throughput it says which key is missing and how to measure one; a dry run predicts from a profile
that profile=true measured; CPU ranks are modelled as Open MPI reduces them, GPUs as NCCL's
rings. The `hvdtrain` command runs in this process."""

import json

import pytest

from hvdtrain.launch import mpirun
from hvdtrain.run.plan import read_plans
from hvdtrain.scaling import step_time
from hvdtrain.scaling.prediction import predict, profile_path

from support.commands import hvdtrain_here
from support.configs import compose

PROFILE = "runs/.profiles/digits-digits_mlp-32-cpu.json"


def here(*args, cwd):
    """`hvdtrain ARGS` in this process, in `cwd`, for a module-scoped fixture; it must launch nothing."""
    def launch(command, **options):
        raise AssertionError(f"launched {command}")

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(mpirun, "started", launch)
        return hvdtrain_here(*args, monkeypatch=monkeypatch, cwd=cwd)


def plans(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return read_plans(result.stdout)


def test_a_dry_run_without_the_network_predicts_nothing(tmp_path):
    swept = plans(here("-m", "recipe=resnet101_synthetic", "cluster=3x1,128x4,4x4", "dry_run=true", cwd=tmp_path))
    assert [plan["predicted_efficiency"] for plan in swept] == [None, None, None]


def test_without_the_bandwidth_the_prediction_names_its_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert predict(compose("recipe=resnet101_synthetic", "cluster=128x4"), "auto") == {
        "predicted_efficiency": None, "predicted_samples_per_s": None,
        "prediction_missing": "unknown: cluster.network.gbps (between hosts, e.g. cluster.network.gbps=25)"}


def test_without_the_latency_the_prediction_names_its_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    unknown_latency = compose("recipe=resnet101_synthetic", "cluster=2x4", "cluster.network.gbps=25",
                              "cluster.network.latency_us=null")
    assert predict(unknown_latency, "auto")["prediction_missing"] == \
        "unknown: cluster.network.latency_us (between hosts, e.g. cluster.network.latency_us=6.6)"


def test_without_a_throughput_the_prediction_says_how_to_measure_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert predict(compose("recipe=digits", "cluster=2x1"), "cpu")["prediction_missing"] == (
        "unknown: cluster.network.gbps (between hosts, e.g. cluster.network.gbps=25); one device's throughput: "
        "measure it on a cpu device with profile=true in place of dry_run=true (it writes "
        "runs/.profiles/digits-digits_mlp-32-cpu.json), or set recipe.reference_throughput")


def test_a_reference_throughput_of_another_batch_is_not_taken(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    other_batch = compose("recipe=vgg16_synthetic", "cluster=1x4", "train.batch_size=32")
    assert predict(other_batch, "cuda")["prediction_missing"] == (
        "unknown: one device's throughput (recipe.reference_throughput is vgg16's at batch 64, not vgg16's at 32): "
        "measure it on a cuda device with profile=true in place of dry_run=true (it writes "
        "runs/.profiles/vgg16_synthetic-vgg16-32-cuda.json), or set recipe.reference_throughput")


@pytest.fixture(scope="module")
def predicted_from_a_profile(tmp_path_factory):
    """(the profile `hvdtrain recipe=digits train.device=cpu profile=true` measured, the plans a
    dry run then gives on one host and on two hosts 1 Gbit/s apart)."""
    import torch

    where = tmp_path_factory.mktemp("profiled")
    threads = torch.get_num_threads()  # the profile sets this process's torch to a rank's share of the cores
    try:
        measured = here("recipe=digits", "train.device=cpu", "profile=true", cwd=where)
    finally:
        torch.set_num_threads(threads)
    assert measured.returncode == 0, measured.stdout + measured.stderr
    profile = json.loads((where / PROFILE).read_text())
    one_host, two_hosts = plans(here("-m", "recipe=digits", "train.device=cpu", "cluster=1x2,2x2",
                                     "cluster.network.gbps=1", "dry_run=true", cwd=where))
    return profile, one_host, two_hosts


def test_a_dry_run_says_it_predicts_from_the_profile(predicted_from_a_profile):
    _, *swept = predicted_from_a_profile
    for plan in swept:
        assert plan["prediction_basis"].startswith(f"profile {PROFILE}: ")


def test_a_dry_run_predicts_an_efficiency_from_the_profile(predicted_from_a_profile):
    _, *swept = predicted_from_a_profile
    for plan in swept:
        assert 0 < plan["predicted_efficiency"] <= 1


def test_the_predicted_throughput_is_the_ranks_measured_one_times_the_efficiency(predicted_from_a_profile):
    profile, *swept = predicted_from_a_profile
    for plan in swept:
        assert plan["predicted_samples_per_s"] == pytest.approx(
            plan["world_size"] * profile["samples_per_s"] * plan["predicted_efficiency"], rel=1e-9)


def test_a_slow_link_between_hosts_predicts_less_efficiency(predicted_from_a_profile):
    _, one_host, two_hosts = predicted_from_a_profile
    assert two_hosts["predicted_efficiency"] < one_host["predicted_efficiency"]  # 1 Gbit/s between the hosts


PROFILED = {"samples_per_s": 100.0, "backward_fraction": 0.5, "gradient_bytes": [4 * 10**6] * 20, "device": "a test's"}
WORKLOAD = step_time.Workload(32, 32 / 100.0, 0.5, tuple(PROFILED["gradient_bytes"]))
ACROSS = step_time.Link(1.0, 10.0)


@pytest.fixture
def on_two_hosts_of_two(tmp_path, monkeypatch):
    """predicted(kind): the prediction of digits on 2x2 at 1 Gbit/s and 10 us between the hosts,
    from a profile of the test's own on a `kind` device."""
    monkeypatch.chdir(tmp_path)
    cfg = compose("recipe=digits", "cluster=2x2", "cluster.network.gbps=1", "cluster.network.latency_us=10")

    def predicted(kind):
        path = profile_path(cfg, kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(PROFILED))
        return predict(cfg, kind)

    return predicted


def test_cpu_ranks_are_modelled_reducing_hierarchically_as_open_mpi_does(on_two_hosts_of_two):
    network = step_time.Network(across=ACROSS, within=step_time.WITHIN_HOST["cpu"])
    expected = step_time.efficiency(WORKLOAD, 2, 2, network, hierarchical=True)
    assert on_two_hosts_of_two("cpu")["predicted_efficiency"] == pytest.approx(expected, rel=1e-12)


def test_gpus_are_modelled_as_one_flat_ring_as_nccl_reduces_them(on_two_hosts_of_two):
    network = step_time.Network(across=ACROSS, within=step_time.WITHIN_HOST["cuda"])
    expected = step_time.efficiency(WORKLOAD, 2, 2, network, hierarchical=False)
    assert on_two_hosts_of_two("cuda")["predicted_efficiency"] == pytest.approx(expected, rel=1e-12)


def test_the_basis_of_a_cpu_prediction_says_it_is_hierarchical(on_two_hosts_of_two):
    assert on_two_hosts_of_two("cpu")["prediction_basis"].endswith(
        "; hierarchical across hosts, as Open MPI reduces CPU ranks")


def test_the_basis_of_a_gpu_prediction_does_not(on_two_hosts_of_two):
    assert "hierarchical" not in on_two_hosts_of_two("cuda")["prediction_basis"]


def test_hierarchical_cpu_ranks_are_predicted_well_above_a_flat_ring(on_two_hosts_of_two):
    """Each host's link carries 1.0 of the bytes, not 1.5."""
    flat = step_time.efficiency(WORKLOAD, 2, 2, step_time.Network(ACROSS, step_time.SHARED_MEMORY))
    assert on_two_hosts_of_two("cpu")["predicted_efficiency"] > flat * 1.1
