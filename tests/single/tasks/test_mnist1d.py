"""MNIST-1D's data (hvdtrain/tasks/mnist1d.py), made in this process: the mnist1d package's for a
seed, made once and kept in a cache file written atomically, made again where that file does not
read. On several ranks, and the mnist1d recipe trained: tests/parallel/tasks/test_mnist1d.py."""

import numpy as np
import pytest
from mnist1d.data import get_dataset_args, make_dataset

from hvdtrain.run.config import typed
from hvdtrain.tasks import mnist1d

SAMPLES = 200  # made in a tenth of a second


def data_config(cache_dir, seed=42, num_samples=SAMPLES):
    return typed({"data": {"source": "mnist1d", "num_samples": num_samples, "seed": seed,
                           "cache_dir": str(cache_dir)}}).data


def cache_files(directory):
    return sorted(path.name for path in directory.iterdir())


@pytest.fixture(scope="module")
def made():
    return mnist1d.make(mnist1d.dataset_args(data_config("unused")))


def test_the_package_keeps_80_percent_for_training(made):
    train_signals, _, val_signals, _ = made
    assert (train_signals.shape, val_signals.shape) == ((160, 40), (40, 40))


def test_signals_are_float32_and_labels_int64(made):
    train_signals, train_labels, _, _ = made
    assert (train_signals.dtype, train_labels.dtype) == (np.float32, np.int64)


def test_the_same_seed_makes_the_same_data(made):
    again = mnist1d.make(mnist1d.dataset_args(data_config("unused")))
    assert all(np.array_equal(a, b) for a, b in zip(made, again))


def test_making_the_data_leaves_numpys_global_generator_as_it_was():
    state = np.random.get_state()
    mnist1d.make(mnist1d.dataset_args(data_config("unused")))
    assert np.array_equal(state[1], np.random.get_state()[1]), "NumPy's global generator was left reseeded"


def test_the_data_is_the_packages_for_its_seed(made):
    args = get_dataset_args()
    args.num_samples = SAMPLES
    package = make_dataset(args)  # its default seed, 42
    for ours, theirs in zip(made, ("x", "y", "x_test", "y_test")):
        np.testing.assert_array_equal(ours, package[theirs].astype(ours.dtype))


def test_another_seed_makes_other_data_of_every_digit_alike(made):
    other = mnist1d.make(mnist1d.dataset_args(data_config("unused", seed=43)))
    assert not np.array_equal(other[0], made[0])
    assert sorted(np.bincount(np.concatenate([other[1], other[3]]))) == [SAMPLES // 10] * 10


def test_the_cache_is_written_once_and_says_where(tmp_path, capsys):
    mnist1d.made_or_cached(data_config(tmp_path))
    [name] = cache_files(tmp_path)
    assert name.startswith("mnist1d-") and name.endswith(".npz")
    assert capsys.readouterr().out == (f"hvdtrain: making MNIST-1D ({SAMPLES} samples, data.seed=42) once, about 1 s; "
                                       f"it is kept in {tmp_path / name}\n")


def test_the_cache_is_then_read_not_made_again(tmp_path, monkeypatch, capsys):
    made = mnist1d.made_or_cached(data_config(tmp_path))
    capsys.readouterr()

    def must_not_be_called(args):
        raise AssertionError("made again although the cache holds it")

    monkeypatch.setattr(mnist1d, "make", must_not_be_called)
    read = mnist1d.made_or_cached(data_config(tmp_path))
    assert all(np.array_equal(a, b) for a, b in zip(made, read))
    assert capsys.readouterr().out == "" and len(cache_files(tmp_path)) == 1


def test_another_seed_or_size_is_cached_in_a_file_of_its_own(tmp_path):
    mnist1d.made_or_cached(data_config(tmp_path))
    mnist1d.made_or_cached(data_config(tmp_path, seed=7))
    mnist1d.made_or_cached(data_config(tmp_path, num_samples=100))
    assert len(cache_files(tmp_path)) == 3


def test_a_cache_that_fails_to_be_written_leaves_no_file(tmp_path, monkeypatch):
    def disk_fails(descriptor):
        raise OSError("no space left on device")

    monkeypatch.setattr("os.fsync", disk_fails)
    with pytest.raises(OSError, match="no space left"):
        mnist1d.made_or_cached(data_config(tmp_path))
    assert cache_files(tmp_path) == []  # neither a part of the file nor its temporary file


@pytest.fixture
def cut_cache(tmp_path, capsys):
    """(the data, its cache file cut short as a disk that lost the file's end, what made_or_cached
    then gives, what it printed)."""
    made = mnist1d.made_or_cached(data_config(tmp_path))
    [path] = tmp_path.iterdir()
    path.write_bytes(path.read_bytes()[:1000])
    capsys.readouterr()
    again = mnist1d.made_or_cached(data_config(tmp_path))
    return made, path, again, capsys.readouterr().out


def test_a_cache_that_does_not_read_says_so(cut_cache):
    _, path, _, printed = cut_cache
    assert f"hvdtrain: MNIST-1D cache {path} does not read (BadZipFile" in printed


def test_a_cache_that_does_not_read_is_made_again(cut_cache):
    made, path, again, _ = cut_cache
    assert all(np.array_equal(a, b) for a, b in zip(made, again))
    assert all(np.array_equal(a, b) for a, b in zip(made, mnist1d.read_cache(path)))
