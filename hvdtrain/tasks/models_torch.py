"""The models of the catalog (hvdtrain/run/config/model.py), built for PyTorch."""

import torch.nn as nn

from hvdtrain.tasks import MNIST1D_CNN_CHANNELS, MNIST1D_MLP_HIDDEN
from hvdtrain.tasks.data import MNIST1D_LENGTH

# Of a signal's 40 positions the CNN's three stride-2 convolutions leave 19, 10, then 5.
MNIST1D_CONVOLVED_LENGTH = 5


def build_model(model_cfg):
    return _BUILDERS[model_cfg.name](model_cfg)


def _torchvision_model(name, **options):
    import torchvision  # over a second to import on every rank: only its models need it

    return getattr(torchvision.models, name)(**options)


def _resnet(model_cfg):
    # torchvision's zero_init_residual sets gamma = 0 in the last BN of every residual block,
    # so that each block starts as the identity (Goyal et al. 2017).
    return _torchvision_model(model_cfg.name, num_classes=model_cfg.num_classes,
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


def _mnist1d_cnn(model_cfg):
    channels = MNIST1D_CNN_CHANNELS
    return nn.Sequential(
        nn.Conv1d(1, channels, 5, stride=2, padding=1), nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(channels * MNIST1D_CONVOLVED_LENGTH, model_cfg.num_classes),
    )


class ResidualMLP(nn.Module):
    """MNIST-1D's MLP: two hidden ReLU layers, the second one's output added to its input."""

    def __init__(self, inputs, hidden, classes):
        super().__init__()
        self.flatten = nn.Flatten()
        self.hidden1 = nn.Linear(inputs, hidden)
        self.hidden2 = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, signals):
        hidden = self.hidden1(self.flatten(signals)).relu()
        hidden = hidden + self.hidden2(hidden).relu()
        return self.classifier(hidden)


_BUILDERS = {
    "resnet50": _resnet,
    "resnet101": _resnet,
    "resnet152": _resnet,
    "vgg16": lambda model_cfg: _torchvision_model("vgg16", num_classes=model_cfg.num_classes),
    # Without the auxiliary classifier, as MMPretrain trains it; init_weights: torchvision's own scheme.
    "inception_v3": lambda model_cfg: _torchvision_model(
        "inception_v3", num_classes=model_cfg.num_classes, aux_logits=False, init_weights=True),
    "digits_cnn": _digits_cnn,
    "digits_mlp": _digits_mlp,
    "mnist1d_cnn": _mnist1d_cnn,
    "mnist1d_mlp": lambda model_cfg: ResidualMLP(MNIST1D_LENGTH, MNIST1D_MLP_HIDDEN, model_cfg.num_classes),
}
