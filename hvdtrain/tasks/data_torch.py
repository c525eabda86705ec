"""The data sources of the catalog (hvdtrain/run/config/data.py), as PyTorch datasets.

A sample is asked for by a key (index, seed): the seed drives that sample's random augmentation,
so the same sample in the same epoch looks the same however the epoch is split into runs, ranks
or loader processes (see hvdtrain/training/sharding.py).
"""

import torch
from torch.utils.data import Dataset

from hvdtrain.tasks.data import SYNTHETIC_POOL, digits_split
from hvdtrain.tasks.mnist1d import mnist1d_split


def build_datasets(data_cfg, num_classes, seed, decode="cpu"):
    """(training set, validation set) for the data config; an ImageFolder tree's images decoded
    as `decode` says ("cpu" or "gpu": data.decode as the rank resolved it)."""
    if data_cfg.source == "digits":
        return _in_memory(*digits_split(data_cfg.val_size))
    if data_cfg.source == "mnist1d":
        return _in_memory(*mnist1d_split(data_cfg))
    if data_cfg.source == "synthetic":
        shape = (3, data_cfg.image_size, data_cfg.image_size)
        return (SyntheticImages(data_cfg.train_size, shape, num_classes, seed),
                SyntheticImages(data_cfg.val_size, shape, num_classes, seed + 1))
    # torchvision takes over a second to import on every rank: only image folders need it
    from hvdtrain.tasks.image_folder_torch import image_folders

    return image_folders(data_cfg, num_classes, decode)


def rank_inputs(dataset, device, dtype, memory_format):
    """What turns the loader's batches of `dataset` into (inputs, labels) on this rank: for an
    ImageFolder tree decoded on the device, the decoding (on `device`, as `dtype` in
    `memory_format`); for other data, the batches as they come."""
    make = getattr(dataset, "rank_inputs", None)
    return make(device, dtype, memory_format) if make else LoaderInputs()


def collate_function(dataset):
    """How the loader makes a batch of `dataset`'s samples (None: its default)."""
    return getattr(dataset, "collate", None)


class LoaderInputs:
    """A rank's inputs as the loader gives them, (images, labels) with nothing to count."""

    def batches(self, loader):
        return iter(loader)

    def counts(self):
        return None


class TensorSamples(Dataset):
    """Samples held in memory; they have no random augmentation, so the seed is unused."""

    def __init__(self, inputs, labels):
        self.inputs, self.labels = inputs, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, key):
        index, _seed = key
        return self.inputs[index], self.labels[index]


class SyntheticImages(Dataset):
    def __init__(self, size, shape, num_classes, seed):
        generator = torch.Generator().manual_seed(seed)
        self.size = size
        self.images = torch.randn((SYNTHETIC_POOL, *shape), generator=generator)
        self.labels = torch.randint(num_classes, (SYNTHETIC_POOL,), generator=generator)

    def __len__(self):
        return self.size

    def __getitem__(self, key):
        index, _seed = key
        return self.images[index % SYNTHETIC_POOL], self.labels[index % SYNTHETIC_POOL]


def _in_memory(train_inputs, train_labels, val_inputs, val_labels):
    """Training and validation sets of arrays; the inputs get one channel, first as PyTorch wants it
    (N x 1 x 8 x 8 digits, N x 1 x 40 signals)."""
    train_inputs, train_labels, val_inputs, val_labels = map(
        torch.from_numpy, (train_inputs, train_labels, val_inputs, val_labels))
    return (TensorSamples(train_inputs.unsqueeze(1), train_labels),
            TensorSamples(val_inputs.unsqueeze(1), val_labels))
