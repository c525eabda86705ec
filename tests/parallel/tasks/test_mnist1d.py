"""MNIST-1D on real ranks (hvdtrain/tasks/mnist1d.py): every rank gets rank 0's data, which rank 0
alone makes or reads, while the others wait without a stall warning; the paper's two models in
Keras take the tensorflow data; the mnist1d recipe, here with LARS, trains and reports. The data
made in one process: tests/single/tasks/test_mnist1d.py."""

import hashlib
import io

import pytest

from hvdtrain.run.config import typed
from hvdtrain.tasks import mnist1d

from support.commands import newest_checkpoint, results_of, run_hvdtrain
from support.ranks import run_ranks

SAMPLES = 200  # made in a tenth of a second
TIMEOUT = 240


def data_config(cache_dir, seed=42, num_samples=SAMPLES):
    return typed({"data": {"source": "mnist1d", "num_samples": num_samples, "seed": seed,
                           "cache_dir": str(cache_dir)}}).data


def cache_files(directory):
    return sorted(path.name for path in directory.iterdir())


def ranks_share_rank_0s_data(cache_dir):
    import time
    from pathlib import Path

    from hvdtrain import core

    core.init()
    rank = core.rank()
    if rank == 0:
        make = mnist1d.make

        def slow_make(args):  # as 100,000 samples are, past the stall inspector's limits of this job
            time.sleep(4)
            return make(args)

        mnist1d.make, mnist1d.WAIT_REPORT_S = slow_make, 0.2
    else:
        # this rank's file system has no such directory, and this rank must not make the data
        cache_dir = Path(cache_dir) / f"rank-{rank}-has-no-such-directory"
        mnist1d.make = mnist1d.made_or_cached = None
    arrays = mnist1d.mnist1d_split(data_config(cache_dir))
    digest = hashlib.sha256(b"".join(array.tobytes() for array in arrays)).hexdigest()
    assert len(set(core.allgather_object(digest))) == 1, "the ranks have different data"
    assert arrays[0].shape == (160, 40) and arrays[0].flags.writeable


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(how 2 ranks that checked that each got rank 0's data ended, the cache directory). While
    rank 0 makes the data the others wait in short collectives, which the stall inspector, here
    set to stop the job after 3 s of waiting in one, lets be. (1 s was too tight for a loaded
    machine: rank 0 writes the cache between its last report and the broadcast.)"""
    cache_dir = tmp_path_factory.mktemp("cache")
    result = run_ranks(2, ranks_share_rank_0s_data, cache_dir, timeout=60, expect_success=False,
                       env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    return result, cache_dir


def test_every_rank_gets_rank_0s_data(shared):
    result, _ = shared
    assert result.returncode == 0, result.stdout


def test_the_ranks_wait_for_rank_0s_data_without_a_stall_warning(shared):
    result, _ = shared
    assert "Stall" not in result.stdout


def test_only_rank_0_writes_the_cache(shared):
    _, cache_dir = shared
    [name] = cache_files(cache_dir)
    assert name.startswith("mnist1d-")


# The Keras models on the tensorflow data, in a job of one rank. Every check takes the job's one
# argument, the cache directory of the data.

def tensorflow_data(cache_dir):
    """(training set, validation set) of SAMPLES signals as the tensorflow loop takes them."""
    from hvdtrain import core
    from hvdtrain.tasks.data_tensorflow import build_datasets

    core.init()
    return build_datasets(data_config(cache_dir), 10, 0)


def keras_model(name):
    from hvdtrain.tasks.models_tensorflow import build_model

    return build_model(typed({"model": {"name": name, "num_classes": 10}}).model, 224)


def the_tensorflow_data_has_the_packages_split(cache_dir):
    train, val = tensorflow_data(cache_dir)
    assert (len(train), len(val)) == (160, 40)


def the_tensorflow_data_gives_batches_of_signals_of_40_values(cache_dir):
    train, _ = tensorflow_data(cache_dir)
    signals, labels = next(iter(train.batches(list(range(7)), 7)))
    assert signals.shape == (7, 40, 1) and labels.shape == (7,)


def the_keras_models_have_the_papers_parameters(cache_dir):
    for name, parameters in (("mnist1d_cnn", 5210), ("mnist1d_mlp", 15210)):
        model = keras_model(name)
        assert model.count_params() == parameters, (name, model.count_params())


def the_keras_models_classify_a_batch_of_the_data(cache_dir):
    train, _ = tensorflow_data(cache_dir)
    signals, _ = next(iter(train.batches(list(range(7)), 7)))
    for name in ("mnist1d_cnn", "mnist1d_mlp"):
        assert keras_model(name)(signals).shape == (7, 10)


KERAS = [the_tensorflow_data_has_the_packages_split, the_tensorflow_data_gives_batches_of_signals_of_40_values,
         the_keras_models_have_the_papers_parameters, the_keras_models_classify_a_batch_of_the_data]


@pytest.fixture(scope="module")
def keras_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("keras-cache")


@pytest.mark.parametrize("check", KERAS, ids=lambda check: check.__name__)
def test_the_keras_models_are_the_papers_and_take_the_tensorflow_data(ranks, keras_cache, check):
    ranks.run(1, KERAS, keras_cache, timeout=120).assert_passed(check)


@pytest.fixture(scope="module")
def mnist1d_run(tmp_path_factory):
    """`hvdtrain recipe=mnist1d optimizer=lars` on 1000 samples for one epoch: (run directory,
    cache directory, what the command gave)."""
    where = tmp_path_factory.mktemp("mnist1d")
    run_dir, cache_dir = where / "run", where / "cache"
    result = run_hvdtrain("recipe=mnist1d", "optimizer=lars", "data.num_samples=1000", f"data.cache_dir={cache_dir}",
                          "train.epochs=1", f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, cache_dir, result


def test_rank_0_alone_makes_the_data_of_a_run(mnist1d_run):
    _, _, result = mnist1d_run
    assert result.stdout.count("hvdtrain: making MNIST-1D (1000 samples, data.seed=42) once") == 1


def test_a_run_keeps_its_data_in_one_cache_file(mnist1d_run):
    _, cache_dir, _ = mnist1d_run
    assert len(cache_files(cache_dir)) == 1


def test_the_mnist1d_recipe_trains_with_lars_on_two_ranks(mnist1d_run):
    run_dir, _, _ = mnist1d_run
    results = results_of(run_dir)
    assert (results["recipe"], results["world_size"], results["epochs_completed"]) == ("mnist1d", 2, 1)


def test_every_validation_signal_is_counted_once(mnist1d_run):
    run_dir, _, _ = mnist1d_run
    assert round(results_of(run_dir)["metrics"]["val_top1"] * 200 / 100, 6).is_integer()  # 200 validation signals


def test_the_mnist1d_recipe_targets_the_papers_accuracy(mnist1d_run):
    run_dir, _, _ = mnist1d_run
    results = results_of(run_dir)
    assert results["target"]["value"] == 94.0 and "arXiv:2011.14439" in results["target"]["source"]


@pytest.fixture(scope="module")
def lars_state(mnist1d_run):
    """The optimizer state of the run's newest checkpoint."""
    import torch

    run_dir, _, _ = mnist1d_run
    return newest_checkpoint(run_dir, lambda data: torch.load(io.BytesIO(data), weights_only=True))["optimizer"]


def test_the_cnns_biases_alone_skip_the_adaptation_and_weight_decay(lars_state):
    groups = lars_state["param_groups"]
    assert sorted((group.get("layer_adaptation", True), len(group["params"])) for group in groups) == [
        (False, 4), (True, 4)]


def test_every_parameter_has_a_momentum_buffer(lars_state):
    assert all("momentum_buffer" in entry for entry in lars_state["state"].values())
