"""`hvdtrain.tensorflow.keras` is `hvdtrain.keras`, as horovod.tensorflow.keras is Horovod's Keras API."""

import sys

from hvdtrain import keras

sys.modules[__name__] = keras
sys.modules[f"{__name__}.callbacks"] = keras.callbacks
