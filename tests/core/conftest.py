import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.runner import launcher

RANK_MAIN = Path(__file__).resolve().parents[1] / "rank_main.py"


def run_alone(function, *args, timeout=60):
    """Run `function` as a plain `python script.py` process, without mpirun: a job of size 1."""
    command = [sys.executable, "-u", str(RANK_MAIN), function.__code__.co_filename, function.__name__,
               *map(str, args)]
    try:
        result = launcher.run(command, timeout=timeout, capture=True)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{function.__name__} alone did not finish in {timeout} s:\n{expired.output}")
    if result.returncode != 0:
        pytest.fail(f"{function.__name__} alone failed (exit {result.returncode}):\n{result.stdout}")
    return result


@pytest.fixture
def alone():
    return run_alone
