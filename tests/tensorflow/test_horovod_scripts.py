"""Scripts written for horovod.tensorflow and horovod.tensorflow.keras run unchanged except
for their import line. Like most existing Horovod scripts they use Keras 2 idioms, so they
run under tf-keras (TF_USE_LEGACY_KERAS=1)."""

import os
import re
import sys
from pathlib import Path

import pytest

from hvdtrain.launch import mpirun as launcher

SCRIPTS = Path(__file__).parent / "scripts"
IMPORT_LINES = {"horovod_tf2_digits.py": "import hvdtrain.tensorflow as hvd",
                "horovod_keras_digits.py": "import hvdtrain.tensorflow.keras as hvd"}


@pytest.mark.parametrize("script", sorted(IMPORT_LINES))
def test_only_the_import_line_differs_from_horovod(script):
    lines = (SCRIPTS / script).read_text().splitlines()
    assert IMPORT_LINES[script] in lines
    docstring_end = lines.index('"""', 1)
    assert [line for line in lines[docstring_end:] if "hvdtrain" in line] == [IMPORT_LINES[script]]


@pytest.mark.parametrize("script", sorted(IMPORT_LINES))
def test_horovod_script_trains_on_two_ranks(script, tmp_path):
    base = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}
    env = launcher.worker_environment(2, {**os.environ, **base})
    command = launcher.mpirun_command([sys.executable, "-u", str(SCRIPTS / script), str(tmp_path)], num_proc=2,
                                      env=env)
    result = launcher.run(command, env=env, timeout=240, capture=True)
    assert result.returncode == 0, result.stdout
    accuracy = re.findall(r"Accuracy: ([\d.]+)%", result.stdout)
    assert len(accuracy) == 1 and float(accuracy[0]) > 90.0, result.stdout
    assert "weights identical on all ranks: True" in result.stdout, result.stdout
    if script == "horovod_keras_digits.py":
        assert "Epoch 3: finished gradual learning rate warmup to 0.002." in result.stdout, result.stdout
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint-{e}.h5" for e in range(1, 5)]
