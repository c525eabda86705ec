"""What each part of the run imports (hvdtrain/training/loop.py and the loops it serves): the
command, the plan, the worker's entry point, the reports and the shared loop import no framework,
and each framework's loop imports only its own. Each is imported in a fresh interpreter."""

import ast
import subprocess
import sys

import pytest


@pytest.mark.parametrize("imports,absent", [
    ("import hvdtrain.launch.cli, hvdtrain.run.plan, hvdtrain.training.worker, hvdtrain.reporting.report, "
     "hvdtrain.reporting.run_log", ("torch", "tensorflow")),
    ("import hvdtrain.training.loop", ("torch", "tensorflow")),
    ("import hvdtrain.training.train_torch", ("tensorflow", "keras")),
    ("import hvdtrain.training.train_tensorflow", ("torch",)),
], ids=["the command, plan, worker and reports", "the shared loop", "the torch loop", "the tensorflow loop"])
def test_each_part_imports_only_its_framework(imports, absent):
    code = imports + "\nimport sys\nprint(sorted({name.split('.')[0] for name in sys.modules}))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    modules = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert not set(absent) & set(modules)
