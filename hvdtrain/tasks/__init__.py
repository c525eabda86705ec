"""What is trained: the models and data sets a recipe can name.

This catalog imports no framework, so that the `hvdtrain` command can check a config in a
fraction of a second; `models_torch.py` and `data_torch.py` build the entries for PyTorch,
`models_tensorflow.py` and `data_tensorflow.py` for TensorFlow and Keras, on the
framework-neutral `data.py` and `mnist1d.py`.
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
    # the models of MNIST-1D's paper (Greydanus 2020): a 3-layer 1D CNN and a residual MLP
    "mnist1d_cnn": "signal",
    "mnist1d_mlp": "signal",
}

# Models made of residual blocks: `model.zero_init_residual` applies to these only.
RESIDUAL_MODELS = ("resnet50", "resnet101", "resnet152")

DATA_SOURCES = {
    "imagefolder": "image",  # a tree data.root/{train,val}/<class>/<image>, as ImageNet is usually laid out
    "synthetic": "image",  # random tensors: throughput measurements without a data set
    "digits": "digits",  # scikit-learn's bundled 8x8 digits (1797 images, 10 classes)
    "mnist1d": "signal",  # MNIST-1D: 40-value signals of 10 digits, made by the mnist1d package (mnist1d.py)
}

# The sizes of MNIST-1D's paper models (the repository's notebooks/models.py: 5210 and 15210
# parameters for 10 classes): the CNN's convolutions have 25 channels, the MLP's layers 100 units.
MNIST1D_CNN_CHANNELS, MNIST1D_MLP_HIDDEN = 25, 100

# The smallest input side each image model accepts (its down-sampling stages need that much).
MIN_IMAGE_SIZE = {"inception_v3": 75}
DEFAULT_MIN_IMAGE_SIZE = 32


# The mnist1d package's own train/test split (its get_dataset_args().train_split), which
# hvdtrain keeps: the first 80 % of data.num_samples train.
MNIST1D_TRAIN_SPLIT = 0.8


def expected_train_size(data_cfg):
    """(training samples, the key that sets them) before any data is loaded; the size is None
    where it is unknown until the data is read (an ImageFolder tree without data.train_size)."""
    if data_cfg.source == "mnist1d":
        return int(data_cfg.num_samples * MNIST1D_TRAIN_SPLIT), "data.num_samples"
    return data_cfg.train_size, "data.train_size"
