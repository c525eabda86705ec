"""The models of the catalog (hvdtrain/run/config/model.py), built with Keras for TensorFlow.

The image models are Keras applications without pretrained weights; the digits and MNIST-1D
models have the layers of their PyTorch twins (models_torch.py), channels last, and their layers
with weights named, for checkpoints key the weights by their path (digits_cnn/conv1/kernel).
Every model returns logits.
"""

import re

import keras
from keras import layers

from hvdtrain.tasks import MNIST1D_CNN_CHANNELS, MNIST1D_MLP_HIDDEN
from hvdtrain.tasks.data import MNIST1D_LENGTH

DIGITS_SHAPE = (8, 8, 1)
MNIST1D_SHAPE = (MNIST1D_LENGTH, 1)


def build_model(model_cfg, image_size):
    """The model for `model_cfg`; image models take image_size x image_size RGB images."""
    return _BUILDERS[model_cfg.name](model_cfg, (image_size, image_size, 3))


def _application(constructor):
    def build(model_cfg, input_shape):
        return constructor(weights=None, input_shape=input_shape, classes=model_cfg.num_classes,
                           classifier_activation=None)

    return build


def _resnet(constructor):
    application = _application(constructor)

    def build(model_cfg, input_shape):
        model = application(model_cfg, input_shape)
        if model_cfg.zero_init_residual:
            # gamma = 0 in the last BN of every residual block (Keras names it convN_blockM_3_bn), so
            # that each block starts as the identity (Goyal et al. 2017)
            for layer in model.layers:
                if re.fullmatch(r"conv\d+_block\d+_3_bn", layer.name):
                    layer.gamma.assign(keras.ops.zeros_like(layer.gamma))
        return model

    return build


def _batch_norm(name):
    # PyTorch's BatchNorm2d defaults: its momentum 0.1 is Keras's 0.9
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)


def _digits_cnn(model_cfg, _input_shape):
    return keras.Sequential([
        keras.Input(DIGITS_SHAPE),
        layers.Conv2D(32, 3, padding="same", use_bias=False, name="conv1"), _batch_norm("bn1"), layers.ReLU(),
        layers.Conv2D(64, 3, padding="same", use_bias=False, name="conv2"), _batch_norm("bn2"), layers.ReLU(),
        layers.MaxPooling2D(2), layers.Flatten(),
        layers.Dense(model_cfg.num_classes, name="classifier"),
    ], name="digits_cnn")


def _digits_mlp(model_cfg, _input_shape):
    return keras.Sequential([
        keras.Input(DIGITS_SHAPE), layers.Flatten(),
        layers.Dense(256, activation="relu", name="hidden"), layers.Dense(model_cfg.num_classes, name="classifier"),
    ], name="digits_mlp")


def _mnist1d_cnn(model_cfg, _input_shape):
    def convolution(kernel_size, name):
        # PyTorch's padding=1 at both ends, which none of Keras's paddings is
        return [layers.ZeroPadding1D(1),
                layers.Conv1D(MNIST1D_CNN_CHANNELS, kernel_size, strides=2, activation="relu", name=name)]

    return keras.Sequential([
        keras.Input(MNIST1D_SHAPE), *convolution(5, "conv1"), *convolution(3, "conv2"), *convolution(3, "conv3"),
        layers.Flatten(), layers.Dense(model_cfg.num_classes, name="classifier"),
    ], name="mnist1d_cnn")


def _mnist1d_mlp(model_cfg, _input_shape):
    signals = keras.Input(MNIST1D_SHAPE)
    hidden = layers.Dense(MNIST1D_MLP_HIDDEN, activation="relu", name="hidden1")(layers.Flatten()(signals))
    hidden = layers.Add()([hidden, layers.Dense(MNIST1D_MLP_HIDDEN, activation="relu", name="hidden2")(hidden)])
    return keras.Model(signals, layers.Dense(model_cfg.num_classes, name="classifier")(hidden), name="mnist1d_mlp")


_BUILDERS = {
    "resnet50": _resnet(keras.applications.ResNet50),
    "resnet101": _resnet(keras.applications.ResNet101),
    "resnet152": _resnet(keras.applications.ResNet152),
    "vgg16": _application(keras.applications.VGG16),
    "inception_v3": _application(keras.applications.InceptionV3),  # Keras's has no auxiliary classifier
    "digits_cnn": _digits_cnn,
    "digits_mlp": _digits_mlp,
    "mnist1d_cnn": _mnist1d_cnn,
    "mnist1d_mlp": _mnist1d_mlp,
}
