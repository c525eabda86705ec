"""A stand-in for MNIST where it cannot be downloaded: scikit-learn's handwritten digits (1,797
images of 8x8, the same ten classes), scaled to 28x28, written as MNIST's raw files, which
torchvision's `datasets.MNIST(ROOT, download=True)` then finds and does not download.

    python scripts/make_mnist_standin.py ROOT        # writes ROOT/MNIST/raw/*-ubyte

Horovod's PyTorch MNIST examples run on it unchanged (docs/horovod_tests.md). 1,497 images train
and 300 test; a model that learns reaches well over 90 % on them.
"""

import argparse
import struct
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

TEST_IMAGES = 300


def mnist_sized(images):
    """8x8 images of 0..16 as 28x28 of 0..255: each pixel 3x3, centred in a 2-pixel border."""
    scaled = np.kron(images, np.ones((1, 3, 3))) * (255 / 16)
    return np.pad(scaled, ((0, 0), (2, 2), (2, 2))).round().astype(np.uint8)


def write_idx(path, array):
    """MNIST's idx format: a magic number naming unsigned bytes and the rank, the dimensions,
    then the bytes."""
    with open(path, "wb") as f:
        f.write(struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="the folder given to datasets.MNIST")
    root = parser.parse_args().root
    digits = load_digits()
    images, labels = mnist_sized(digits.images), digits.target.astype(np.uint8)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", slice(TEST_IMAGES, None)), ("t10k", slice(None, TEST_IMAGES))):
        write_idx(raw / f"{split}-images-idx3-ubyte", images[part])
        write_idx(raw / f"{split}-labels-idx1-ubyte", labels[part])
    print(f"{raw}: {len(images) - TEST_IMAGES} training and {TEST_IMAGES} test images")


if __name__ == "__main__":
    main()
