"""ImageFolder trees (data.source=imagefolder) as PyTorch datasets, with torchvision's
transforms; a module of its own so that other data sources do not import torchvision."""

from pathlib import Path

import torch
import torchvision
from torchvision import transforms

from hvdtrain.tasks.data import IMAGENET_MEAN, IMAGENET_STD, check_classes


def image_folders(data_cfg, num_classes):
    """(training set, validation set) of root/train and root/val: random resized crops and flips
    for training, resize and center crop for validation, both normalized as ImageNet is."""
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train = SeededImageFolder(Path(data_cfg.root) / "train", transforms.Compose([
        transforms.RandomResizedCrop(data_cfg.image_size), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), normalize]))
    val = SeededImageFolder(Path(data_cfg.root) / "val", transforms.Compose([
        transforms.Resize(data_cfg.resize_size), transforms.CenterCrop(data_cfg.image_size),
        transforms.ToTensor(), normalize]))
    check_classes(data_cfg, train.classes, val.classes, num_classes)
    return train, val


class SeededImageFolder(torchvision.datasets.ImageFolder):
    def __getitem__(self, key):
        index, seed = key
        with torch.random.fork_rng(devices=[]):  # torchvision's random transforms draw from torch's generator
            torch.manual_seed(seed)
            return super().__getitem__(index)
