"""scripts/make_mnist_standin.py writes files that torchvision's MNIST reads without downloading:
MNIST's shapes and byte range, scikit-learn's digits and labels in them."""

import sys

import numpy as np
from sklearn.datasets import load_digits
from torchvision import datasets

from support.scripts import load_script


def test_torchvision_reads_the_standin_as_mnist_without_downloading(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["make_mnist_standin.py", str(tmp_path)])
    load_script("make_mnist_standin").main()
    # download=True finds the files and downloads nothing (this machine could not)
    train = datasets.MNIST(str(tmp_path), train=True, download=True)
    test = datasets.MNIST(str(tmp_path), train=False)
    assert (len(train), len(test)) == (1497, 300)
    assert tuple(train.data.shape[1:]) == (28, 28) and train.data.dtype.is_floating_point is False
    digits = load_digits()
    np.testing.assert_array_equal(test.targets.numpy(), digits.target[:300])
    np.testing.assert_array_equal(train.targets.numpy(), digits.target[300:])
    # The digit's pixels, 3x3 each, inside a 2-pixel border; 16 (full ink) becomes 255
    first = test.data[0].numpy()
    assert first[:2].max() == 0 and first[:, :2].max() == 0
    np.testing.assert_array_equal(first[2:26:3, 2:26:3], np.round(digits.images[0] * 255 / 16).astype(np.uint8))
