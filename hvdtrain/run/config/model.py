"""The `model` section: the models a recipe can name, each with the kind of input it takes, so
that a recipe cannot pair, say, ResNet-50 with 8x8 digits. hvdtrain/tasks/models_torch.py and
models_tensorflow.py build them."""

from dataclasses import dataclass

from omegaconf import MISSING

MODELS = {
    "resnet50": "image",
    "resnet101": "image",
    "resnet152": "image",
    "vgg16": "image",
    "inception_v3": "image",
    "digits_cnn": "digits",
    "digits_mlp": "digits",
    # the models of MNIST-1D's paper (Greydanus 2020): a 3-layer 1D CNN and a residual MLP
    "mnist1d_cnn": "signal",
    "mnist1d_mlp": "signal",
}

# Models made of residual blocks: `model.zero_init_residual` applies to these only.
RESIDUAL_MODELS = ("resnet50", "resnet101", "resnet152")

# The smallest input side each image model accepts (its down-sampling stages need that much).
MIN_IMAGE_SIZE = {"inception_v3": 75}
DEFAULT_MIN_IMAGE_SIZE = 32


@dataclass
class ModelConfig:
    name: str = MISSING
    num_classes: int = 1000
    zero_init_residual: bool = False  # Goyal et al.: gamma = 0 in the last BN of every residual block


def image_models():
    return [name for name, kind in MODELS.items() if kind == "image"]


def check(cfg, problems):
    model = cfg.model
    problems.check(model.name in MODELS, "model.name", f"unknown model; allowed: {', '.join(MODELS)}")
    problems.check(model.num_classes >= 2, "model.num_classes", "must be at least 2")
    problems.check(not model.zero_init_residual or model.name in RESIDUAL_MODELS, "model.zero_init_residual",
                   f"applies to residual networks only ({', '.join(RESIDUAL_MODELS)}), not {model.name}")
