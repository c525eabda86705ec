"""The data sources of the catalog (hvdtrain/run/config/data.py) as TensorFlow input, images channels last.

A data set gives the batches of any list of sample indices (the shards of hvdtrain/training/sharding.py, as in
the PyTorch loop); training samples come with their augmentation seeds, which drive
TensorFlow's stateless random ops, so that the same sample in the same epoch looks the same
however the epoch is split into runs or ranks. An ImageFolder tree is listed in the order
torchvision's ImageFolder lists it, so that an index means the same image in both frameworks.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List

import numpy as np
import tensorflow as tf

from hvdtrain.tasks.data import IMAGENET_MEAN, IMAGENET_STD, SYNTHETIC_POOL, check_classes, digits_split
from hvdtrain.tasks.image_files import CROP_AREA, CROP_ASPECT_RATIO, CROP_ATTEMPTS
from hvdtrain.tasks.mnist1d import mnist1d_split

# What torchvision's ImageFolder takes, and the part of it TensorFlow can decode.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DECODABLE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def build_datasets(data_cfg, num_classes, seed):
    """(training set, validation set) for the data config."""
    if data_cfg.source == "digits":
        return _in_memory(*digits_split(data_cfg.val_size))
    if data_cfg.source == "mnist1d":
        return _in_memory(*mnist1d_split(data_cfg))
    if data_cfg.source == "synthetic":
        shape = (data_cfg.image_size, data_cfg.image_size, 3)
        return (_synthetic(data_cfg.train_size, shape, num_classes, seed),
                _synthetic(data_cfg.val_size, shape, num_classes, seed + 1))
    root, size = Path(data_cfg.root), data_cfg.image_size
    train = _image_folder(root / "train", data_cfg, lambda image, seed: _crop_and_flip(image, seed, size))
    val = _image_folder(root / "val", data_cfg,
                        lambda image, _seed: _resize_and_center_crop(image, data_cfg.resize_size, size))
    check_classes(data_cfg, train.classes, val.classes, num_classes)
    return train, val


@dataclass
class SamplesInMemory:
    """Samples held in memory, without augmentation (the seeds are unused). Sample i is image
    i mod len(images): a small pool of synthetic images makes an epoch of any size."""

    images: np.ndarray
    labels: np.ndarray
    size: int

    def __len__(self):
        return self.size

    def batches(self, indices, batch_size, seeds=None):
        for start in range(0, len(indices), batch_size):
            chosen = np.asarray(indices[start:start + batch_size]) % len(self.labels)
            yield tf.constant(self.images[chosen]), tf.constant(self.labels[chosen])


@dataclass
class ImageFolder:
    """Image files, decoded and transformed by a tf.data pipeline."""

    paths: np.ndarray
    labels: np.ndarray
    classes: List[str]
    transform: Callable  # (uint8 image, seed) -> image of floats in [0, 255]
    workers: int

    def __len__(self):
        return len(self.paths)

    def batches(self, indices, batch_size, seeds=None):
        seeds = np.zeros(len(indices), np.int64) if seeds is None else np.asarray(seeds, np.int64)
        samples = tf.data.Dataset.from_tensor_slices((self.paths[indices], self.labels[indices], seeds))
        return (samples.map(self._load, num_parallel_calls=self.workers or None, deterministic=True)
                .batch(batch_size).prefetch(1))

    def _load(self, path, label, seed):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        image = self.transform(image, seed) / 255.0
        return (image - IMAGENET_MEAN) / IMAGENET_STD, label


def _in_memory(train_inputs, train_labels, val_inputs, val_labels):
    """Training and validation sets of arrays; the inputs get one channel, last (8 x 8 x 1 digits,
    40 x 1 signals)."""
    return (SamplesInMemory(train_inputs[..., None], train_labels, len(train_labels)),
            SamplesInMemory(val_inputs[..., None], val_labels, len(val_labels)))


def _synthetic(size, shape, num_classes, seed):
    generator = np.random.default_rng(seed)
    images = generator.standard_normal((SYNTHETIC_POOL, *shape), dtype=np.float32)
    return SamplesInMemory(images, generator.integers(num_classes, size=SYNTHETIC_POOL), size)


def _image_folder(directory, data_cfg, transform):
    """The images of directory/<class>/..., listed as torchvision's ImageFolder lists them: the
    classes sorted, each one's files walked in sorted order, by extension."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise ValueError(f"data.root={data_cfg.root}: {directory} has no class directories")
    paths, labels = [], []
    for label, name in enumerate(classes):
        found = [os.path.join(folder, file) for folder, _, files in sorted(os.walk(directory / name, followlinks=True))
                 for file in sorted(files) if file.lower().endswith(IMAGE_EXTENSIONS)]
        if not found:
            raise ValueError(f"data.root={data_cfg.root}: {directory / name} holds no image "
                             f"(extensions: {', '.join(IMAGE_EXTENSIONS)})")
        paths += found
        labels += [label] * len(found)
    undecodable = next((p for p in paths if not p.lower().endswith(DECODABLE_EXTENSIONS)), None)
    if undecodable:
        raise ValueError(f"data.root={data_cfg.root}: {undecodable}: TensorFlow decodes only "
                         f"{', '.join(DECODABLE_EXTENSIONS)} images; convert the others, "
                         f"or train with recipe.framework=torch")
    return ImageFolder(np.array(paths), np.array(labels, np.int64), classes, transform, data_cfg.loader_workers)


def _crop_and_flip(image, seed, size):
    """Training: a random crop of random area and aspect ratio resized to size x size, flipped
    left-right with probability 1/2 (torchvision's RandomResizedCrop and RandomHorizontalFlip)."""
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=tf.stack([seed, 0]),
        min_object_covered=0.0, aspect_ratio_range=CROP_ASPECT_RATIO, area_range=CROP_AREA,
        max_attempts=CROP_ATTEMPTS, use_image_if_no_bounding_boxes=True)
    image = tf.image.resize(tf.slice(image, begin, crop), (size, size), antialias=True)
    return tf.image.stateless_random_flip_left_right(image, seed=tf.stack([seed, 1]))


def _resize_and_center_crop(image, resize_size, size):
    """Validation: the shorter side resized to resize_size, the center size x size cut out
    (torchvision's Resize and CenterCrop)."""
    height_width = tf.cast(tf.shape(image)[:2], tf.float64)
    resized = tf.cast(height_width * resize_size / tf.reduce_min(height_width), tf.int32)
    image = tf.image.resize(image, resized, antialias=True)
    top, left = tf.unstack(tf.cast(tf.round(tf.cast(resized - size, tf.float64) / 2), tf.int32))
    return tf.image.crop_to_bounding_box(image, top, left, size, size)
