import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain import launcher

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def run_ranks(num_proc, function, *args, timeout=120, env=None, expect_success=True):
    """Run `function` (a module-level function of a test file) on `num_proc` real ranks under
    mpirun, each rank with its share of the cores. A hang fails this test, not the suite."""
    base = dict(os.environ)
    base.update(env or {})
    worker_env = launcher.worker_environment(num_proc, base)
    program = [sys.executable, "-u", str(TESTS / "rank_main.py"), function.__code__.co_filename,
               function.__name__, *map(str, args)]
    command = launcher.mpirun_command(program, num_proc=num_proc, env=worker_env)
    try:
        result = launcher.run(command, env=worker_env, timeout=timeout, capture=True)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{function.__name__} on {num_proc} ranks did not finish in {timeout} s:\n{expired.output}")
    if expect_success and result.returncode != 0:
        pytest.fail(f"{function.__name__} on {num_proc} ranks failed (exit {result.returncode}):\n{result.stdout}")
    return result


@pytest.fixture
def mpirun():
    return run_ranks
