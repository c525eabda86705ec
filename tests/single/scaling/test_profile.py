"""`hvdtrain ... profile=true` (hvdtrain/scaling/profile.py), run in this process: it measures one
device's training step of the recipe's model, writes the figures where a dry run finds them, and
leaves no run directory. A dry run predicting from them: test_prediction.py."""

import json

import pytest

from hvdtrain.launch import mpirun

from support.commands import hvdtrain_here

PROFILE = "runs/.profiles/digits-digits_mlp-32-cpu.json"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """(what `hvdtrain recipe=digits train.device=cpu profile=true` printed, the directory it ran in)."""
    import torch

    def launch(command, **options):
        raise AssertionError(f"launched {command}")

    where = tmp_path_factory.mktemp("profiled")
    threads = torch.get_num_threads()  # the profile sets this process's torch to a rank's share of the cores
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(mpirun, "started", launch)
            result = hvdtrain_here("recipe=digits", "train.device=cpu", "profile=true", monkeypatch=monkeypatch,
                                   cwd=where)
    finally:
        torch.set_num_threads(threads)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, where


@pytest.fixture(scope="module")
def profile(profiled):
    _, where = profiled
    return json.loads((where / PROFILE).read_text())


def test_the_profile_says_where_it_is_written(profiled):
    result, _ = profiled
    assert PROFILE in result.stdout


def test_the_throughput_is_the_batch_over_the_step(profile):
    assert profile["samples_per_s"] == pytest.approx(32 / profile["compute_s"], rel=1e-9)


def test_backward_is_a_part_of_the_step(profile):
    assert 0 < profile["backward_fraction"] < 1


def test_the_gradients_are_the_models_last_layer_first(profile):
    assert profile["gradient_bytes"] == [4 * 10, 4 * 256 * 10, 4 * 256, 4 * 64 * 256]  # the MLP's


def test_a_profile_leaves_no_run_directory(profiled):
    _, where = profiled
    assert [path.name for path in where.iterdir()] == ["runs"]
