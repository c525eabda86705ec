"""What is trained: the models and data sets a recipe can name.

This catalog imports no framework, so that the `hvdtrain` command can check a config in a
fraction of a second; `models_torch.py` and `data_torch.py` build the entries for PyTorch,
`models_tensorflow.py` and `data_tensorflow.py` for TensorFlow and Keras, on the
framework-neutral `data.py`.
Each model and data source says which kind of input it takes or gives, so that a recipe
cannot pair, say, ResNet-50 with 8x8 digits.
"""

MODELS = {
    "resnet50": "image",
    "resnet101": "image",
    "resnet152": "image",
    "vgg16": "image",
    "inception_v3": "image",
    "digits_cnn": "digits",
    "digits_mlp": "digits",
}

# Models made of residual blocks: `model.zero_init_residual` applies to these only.
RESIDUAL_MODELS = ("resnet50", "resnet101", "resnet152")

DATA_SOURCES = {
    "imagefolder": "image",  # a tree data.root/{train,val}/<class>/<image>, as ImageNet is usually laid out
    "synthetic": "image",  # random tensors: throughput measurements without a data set
    "digits": "digits",  # scikit-learn's bundled 8x8 digits (1797 images, 10 classes)
}

# The smallest input side each image model accepts (its down-sampling stages need that much).
MIN_IMAGE_SIZE = {"inception_v3": 75}
DEFAULT_MIN_IMAGE_SIZE = 32
