"""What is trained: the models and data sets a recipe names, built for each framework.

The catalog of names, with the kind of input each model takes and each data source gives, is the
config's (hvdtrain/run/config/model.py and data.py), so that the `hvdtrain` command checks a
config without importing a framework. Here they are built: `models_torch.py` and `data_torch.py`
for PyTorch, `models_tensorflow.py` and `data_tensorflow.py` for TensorFlow and Keras, on the
framework-neutral `data.py` and `mnist1d.py`.
"""

# The sizes of MNIST-1D's paper models (the repository's notebooks/models.py: 5210 and 15210
# parameters for 10 classes): the CNN's convolutions have 25 channels, the MLP's layers 100 units.
MNIST1D_CNN_CHANNELS, MNIST1D_MLP_HIDDEN = 25, 100
