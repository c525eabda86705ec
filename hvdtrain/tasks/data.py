"""What the data sources are whatever the framework: the digits split, the ImageNet
normalization, the size of the synthetic image pool, the class check of an ImageFolder tree and
the length of MNIST-1D's signals (mnist1d.py makes them). data_torch.py and data_tensorflow.py
turn them into their framework's inputs.
"""

import importlib.util
from pathlib import Path

import numpy as np

from hvdtrain.run.config import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DIGITS_SPLIT_SEED = 0  # the split is part of the data set, not of a run's randomness
SYNTHETIC_POOL = 64  # distinct random images; synthetic samples repeat them
MNIST1D_LENGTH = 40  # values per MNIST-1D signal: the mnist1d package's default final_seq_length


class BadFile(ValueError):
    """A data file that no decoder reads; its text names the file."""


def digits_split(val_size):
    """scikit-learn's digits as (train images, train labels, val images, val labels): 8x8 float32
    images in [0, 1] and int64 labels, split by a fixed permutation."""
    pixels, labels = bundled_digits()
    images = (pixels.reshape(-1, 8, 8) / 16.0).astype(np.float32)
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
    val, train = order[:val_size], order[val_size:]
    return images[train], labels[train], images[val], labels[val]


def bundled_digits():
    """The 1,797 digits as scikit-learn's load_digits() gives them, (64 pixel values from 0 to 16
    a row, int64 labels), read from the file the package carries (a row a digit, its label
    last): importing scikit-learn would cost every rank about 2 CPU-seconds, more than a digits
    run's training."""
    package = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    rows = np.loadtxt(Path(package) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return rows[:, :-1], rows[:, -1].astype(np.int64)


def check_classes(data_cfg, train_classes, val_classes, num_classes):
    """An ImageFolder tree's train/ and val/ must have the same classes, as many as the model: a
    ConfigError, which every rank reports in one line and no restart retries."""
    if list(train_classes) != list(val_classes) or len(train_classes) != num_classes:
        raise ConfigError(f"data.root={data_cfg.root}: train/ has {len(train_classes)} classes and val/ has "
                          f"{len(val_classes)}, the model has {num_classes} (model.num_classes); they must agree")
