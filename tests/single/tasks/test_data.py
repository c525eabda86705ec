"""The data sources every framework shares (hvdtrain/tasks/data.py): the digits read from
scikit-learn's own file are scikit-learn's digits, and their split is fixed."""

from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.datasets import load_digits

from hvdtrain.run.config import ConfigError
from hvdtrain.tasks import data


def test_the_bundled_digits_are_scikit_learns():
    pixels, labels = data.bundled_digits()
    digits = load_digits()
    assert np.array_equal(pixels, digits.data) and np.array_equal(labels, digits.target)


def test_the_digits_split_is_the_same_for_every_run():
    first, second = data.digits_split(360), data.digits_split(360)
    assert [len(part) for part in first] == [1437, 1437, 360, 360]
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_a_tree_whose_classes_the_model_does_not_have_is_a_config_error():
    """Every rank meets it and says it in one line; a restart would meet it again."""
    with pytest.raises(ConfigError, match=r"data.root=/d: train/ has 3 classes and val/ has 3, the model has 5 "
                                          r"\(model.num_classes\); they must agree"):
        data.check_classes(SimpleNamespace(root="/d"), ["a", "b", "c"], ["a", "b", "c"], 5)
