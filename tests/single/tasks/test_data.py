"""The data sources every framework shares (hvdtrain/tasks/data.py): the digits read from
scikit-learn's own file are scikit-learn's digits, and their split is fixed."""

import numpy as np
from sklearn.datasets import load_digits

from hvdtrain.tasks import data


def test_the_bundled_digits_are_scikit_learns():
    pixels, labels = data.bundled_digits()
    digits = load_digits()
    assert np.array_equal(pixels, digits.data) and np.array_equal(labels, digits.target)


def test_the_digits_split_is_the_same_for_every_run():
    first, second = data.digits_split(360), data.digits_split(360)
    assert [len(part) for part in first] == [1437, 1437, 360, 360]
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
