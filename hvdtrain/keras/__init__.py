"""`hvdtrain.keras` is `hvdtrain.tensorflow.keras`, as Horovod's Keras API is the same under
`horovod.keras` and `horovod.tensorflow.keras`: a drop-in for either import line."""

import sys

from hvdtrain.tensorflow import keras

sys.modules[__name__] = keras
sys.modules[f"{__name__}.callbacks"] = keras.callbacks
sys.modules[f"{__name__}.elastic"] = keras.elastic
