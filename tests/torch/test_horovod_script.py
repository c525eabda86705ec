"""A script written for horovod.torch runs unchanged except for its import line."""

import re
import sys
from pathlib import Path

from hvdtrain.launch import mpirun as launcher

SCRIPT = Path(__file__).parent / "scripts" / "horovod_digits.py"


def test_only_the_import_line_differs_from_horovod():
    lines = SCRIPT.read_text().splitlines()
    assert "import hvdtrain.torch as hvd" in lines
    assert not [line for line in lines if "hvdtrain" in line and line != "import hvdtrain.torch as hvd"
                and not line.startswith(("`", "Its only", "\"\"\""))]


def test_horovod_script_trains_on_two_ranks():
    env = launcher.worker_environment(2)
    command = launcher.mpirun_command([sys.executable, "-u", str(SCRIPT), "--fp16-allreduce"], num_proc=2, env=env)
    result = launcher.run(command, env=env, timeout=180, capture=True)
    assert result.returncode == 0, result.stdout
    accuracies = [float(a) for a in re.findall(r"Accuracy: ([\d.]+)%", result.stdout)]
    assert len(accuracies) == 6, result.stdout
    assert accuracies[-1] > 90.0, result.stdout
    assert "weights identical on all ranks: True" in result.stdout
