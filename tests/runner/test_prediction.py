"""The plan's prediction (hvdtrain/runner/prediction.py, profiling.py): any HOSTSxSLOTS layout,
what a dry run predicts and what it says is missing, the network keys' checks, and a profile
that a dry run then uses."""

import json

import pytest

from hvdtrain.scaling import step_time as scaling
from hvdtrain.run.config import ConfigError, validate
from hvdtrain.scaling.prediction import predict, profile_path

from support.commands import run_hvdtrain
from support.configs import compose


def plans(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_any_layout_runs_without_a_file_of_its_own_and_a_sweep_over_layouts_composes(tmp_path):
    result = run_hvdtrain("-m", "recipe=resnet101_synthetic", "cluster=3x1,128x4,4x4", "dry_run=true", cwd=tmp_path,
                          env={"PYTHONPROFILEIMPORTTIME": "1"})
    three, big, from_file = plans(result)
    assert (three["world_size"], three["hosts"]) == (3, [{"host": f"<host{i}>", "slots": 1} for i in range(3)])
    assert big["world_size"] == 512 and big["global_batch_size"] == 512 * 64
    assert big["hosts"] == [{"host": f"<host{i}>", "slots": 4} for i in range(128)]
    assert from_file["world_size"] == 16  # conf/cluster/4x4.yaml as before
    # Without the network nothing is predicted, and the command never imports a framework (the
    # import times list every module imported).
    assert [plan["predicted_efficiency"] for plan in (three, big, from_file)] == [None, None, None]
    assert " torch\n" not in result.stderr


def test_composed_layouts_name_themselves():
    cfg = compose("cluster=128x4")
    assert (cfg.cluster.name, cfg.cluster.num_hosts, cfg.cluster.slots) == ("128x4", 128, 4)


BAD_VALUES = {
    "not a layout": ("cluster=abc", "cluster='abc': unknown cluster; allowed: 1x1, 1x2, 1x4, 1x8, 2x4, 2x8, 4x4, "
                                    "4x8, 8x8, 16x8, 32x4, 32x8, local, or any HOSTSxSLOTS such as 3x2"),
    "negative bandwidth": ("cluster.network.gbps=-1", "cluster.network.gbps=-1.0: must be a positive Gbit/s or null"),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_a_bad_layout_or_link_ends_in_one_line(case, tmp_path):
    override, problem = BAD_VALUES[case]
    result = run_hvdtrain("cluster=2x4", override, "dry_run=true", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"hvdtrain: invalid config: {problem}\n")


@pytest.mark.parametrize("overrides, problem", [
    (["cluster=0x4"], "cluster.num_hosts=0: must be at least 1"),
    (["cluster=3x0"], "cluster.slots=0: must be at least 1 rank per host"),
    (["cluster.network.latency_us=-0.5"], "cluster.network.latency_us=-0.5: must be microseconds (0 or more) or null"),
    (["cluster.network.within_gbps=0"], "cluster.network.within_gbps=0.0: must be a positive Gbit/s or null"),
    (["cluster.network.within_latency_us=-1"],
     "cluster.network.within_latency_us=-1.0: must be microseconds (0 or more) or null"),
    (["recipe=vgg16_synthetic", "recipe.reference_throughput.samples_per_s=0"],
     "recipe.reference_throughput.samples_per_s=0.0: must be a positive throughput of one device"),
    (["profile=true", "dry_run=true"],
     "profile=True: profile=true measures one device and dry_run=true prints the plan: run them one after the other"),
])
def test_bad_prediction_settings_are_refused_naming_the_key(overrides, problem):
    with pytest.raises(ConfigError) as refused:
        validate(compose(*overrides))
    assert str(refused.value) == f"invalid config: {problem}"


def test_without_the_network_the_prediction_says_which_key_is_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert predict(compose("recipe=resnet101_synthetic", "cluster=128x4"), "auto") == {
        "predicted_efficiency": None, "predicted_samples_per_s": None,
        "prediction_missing": "unknown: cluster.network.gbps (between hosts, e.g. cluster.network.gbps=25)"}
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
    other_batch = compose("recipe=vgg16_synthetic", "cluster=1x4", "train.batch_size=32")
    assert predict(other_batch, "cuda")["prediction_missing"] == (
        "unknown: one device's throughput (recipe.reference_throughput is vgg16's at batch 64, not vgg16's at 32): "
        "measure it on a cuda device with profile=true in place of dry_run=true (it writes "
        "runs/.profiles/vgg16_synthetic-vgg16-32-cuda.json), or set recipe.reference_throughput")


def test_a_profile_measures_one_device_and_the_dry_run_predicts_from_it(tmp_path):
    result = run_hvdtrain("recipe=digits", "train.device=cpu", "profile=true", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    path = tmp_path / "runs" / ".profiles" / "digits-digits_mlp-32-cpu.json"
    assert str(path.relative_to(tmp_path)) in result.stdout
    profile = json.loads(path.read_text())
    assert profile["samples_per_s"] == pytest.approx(32 / profile["compute_s"], rel=1e-9)
    assert 0 < profile["backward_fraction"] < 1
    assert profile["gradient_bytes"] == [4 * 10, 4 * 256 * 10, 4 * 256, 4 * 64 * 256]  # the MLP's, last layer first
    assert [path.name for path in tmp_path.iterdir()] == ["runs"]  # no run directory left

    one_host, two_hosts = plans(run_hvdtrain("-m", "recipe=digits", "train.device=cpu", "cluster=1x2,2x2",
                                             "cluster.network.gbps=1", "dry_run=true", cwd=tmp_path))
    for plan in (one_host, two_hosts):
        assert plan["prediction_basis"].startswith("profile runs/.profiles/digits-digits_mlp-32-cpu.json: ")
        assert 0 < plan["predicted_efficiency"] <= 1
        assert plan["predicted_samples_per_s"] == pytest.approx(
            plan["world_size"] * profile["samples_per_s"] * plan["predicted_efficiency"], rel=1e-9)
    assert two_hosts["predicted_efficiency"] < one_host["predicted_efficiency"]  # 1 Gbit/s between the hosts


def test_cpu_ranks_are_modelled_as_open_mpi_reduces_them_and_gpus_as_nccls_rings(tmp_path, monkeypatch):
    """Across hosts of several ranks each: hierarchically for CPU ranks (Open MPI's han), as one
    flat ring for GPUs (NCCL)."""
    monkeypatch.chdir(tmp_path)
    profile = {"samples_per_s": 100.0, "backward_fraction": 0.5, "gradient_bytes": [4 * 10**6] * 20,
               "device": "a test's"}
    cfg = compose("recipe=digits", "cluster=2x2", "cluster.network.gbps=1", "cluster.network.latency_us=10")
    got = {}
    for kind in ("cpu", "cuda"):
        path = profile_path(cfg, kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile))
        got[kind] = predict(cfg, kind)
        workload = scaling.Workload(32, 32 / 100.0, 0.5, tuple(profile["gradient_bytes"]))
        network = scaling.Network(across=scaling.Link(1.0, 10.0), within=scaling.WITHIN_HOST[kind])
        expected = scaling.efficiency(workload, 2, 2, network, hierarchical=kind == "cpu")
        assert got[kind]["predicted_efficiency"] == pytest.approx(expected, rel=1e-12), kind
    assert got["cpu"]["prediction_basis"].endswith("; hierarchical across hosts, as Open MPI reduces CPU ranks")
    assert "hierarchical" not in got["cuda"]["prediction_basis"]
    flat = scaling.efficiency(workload, 2, 2, scaling.Network(scaling.Link(1.0, 10.0), scaling.SHARED_MEMORY))
    assert got["cpu"]["predicted_efficiency"] > flat * 1.1  # each host's link carries 1.0 of the bytes, not 1.5
