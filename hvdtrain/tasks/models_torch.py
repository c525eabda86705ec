"""The models of the catalog (tasks/__init__.py), built for PyTorch."""

import torch.nn as nn
import torchvision


def build_model(model_cfg):
    return _BUILDERS[model_cfg.name](model_cfg)


def _resnet(model_cfg):
    # torchvision's zero_init_residual sets gamma = 0 in the last BN of every residual block,
    # so that each block starts as the identity (Goyal et al. 2017).
    return getattr(torchvision.models, model_cfg.name)(num_classes=model_cfg.num_classes,
                                                       zero_init_residual=model_cfg.zero_init_residual)


def _digits_cnn(model_cfg):
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * 4 * 4, model_cfg.num_classes),
    )


def _digits_mlp(model_cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, model_cfg.num_classes))


_BUILDERS = {
    "resnet50": _resnet,
    "resnet101": _resnet,
    "resnet152": _resnet,
    "vgg16": lambda model_cfg: torchvision.models.vgg16(num_classes=model_cfg.num_classes),
    # Without the auxiliary classifier, as MMPretrain trains it; init_weights: torchvision's own scheme.
    "inception_v3": lambda model_cfg: torchvision.models.inception_v3(
        num_classes=model_cfg.num_classes, aux_logits=False, init_weights=True),
    "digits_cnn": _digits_cnn,
    "digits_mlp": _digits_mlp,
}
