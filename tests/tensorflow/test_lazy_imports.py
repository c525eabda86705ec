"""Each framework package imports only its own framework, and hvdtrain.tensorflow works as
a plain `python` process (a job of size 1)."""

import ast
import subprocess
import sys

import pytest

TENSORFLOW_SIDE = """
import hvdtrain.tensorflow as hvd, hvdtrain.keras, hvdtrain.tensorflow.keras as tf_keras_api
from hvdtrain.tensorflow.keras.callbacks import MetricAverageCallback
import tensorflow as tf
assert tf_keras_api is hvdtrain.keras and MetricAverageCallback is hvdtrain.keras.callbacks.MetricAverageCallback
hvd.init()
assert (hvd.size(), hvd.rank()) == (1, 0)
assert float(hvd.allreduce(tf.constant(2.0), op=hvd.Sum)) == 2.0
assert hvd.allgather_object("only") == ["only"]
"""


@pytest.mark.parametrize("imports,loaded,absent", [
    ("import hvdtrain.torch", "torch", "tensorflow"),
    (TENSORFLOW_SIDE, "tensorflow", "torch"),
])
def test_framework_packages_import_only_their_framework(imports, loaded, absent):
    code = imports + "\nimport sys\nprint(sorted({name.split('.')[0] for name in sys.modules}))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    modules = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert loaded in modules and absent not in modules
