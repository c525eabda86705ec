import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.runner import launcher

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def run_ranks(num_proc, function, *args, timeout=120, env=None, expect_success=True, hosts=None, extra_args=()):
    """Run `function` (a module-level function of a test file) on `num_proc` real ranks under
    mpirun (on `hosts`, default this machine), each rank with its share of this machine's
    cores. A hang fails this test, not the suite."""
    base = dict(os.environ)
    base.update(env or {})
    worker_env = launcher.worker_environment(num_proc, base)
    program = [sys.executable, "-u", str(TESTS / "rank_main.py"), function.__code__.co_filename,
               function.__name__, *map(str, args)]
    command = launcher.mpirun_command(program, hosts=hosts, num_proc=num_proc, env=worker_env,
                                      extra_args=extra_args)
    where = f"{num_proc} ranks" if hosts is None else ",".join(f"{h.host}:{h.slots}" for h in hosts)
    try:
        result = launcher.run(command, env=worker_env, timeout=timeout, capture=True)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{function.__name__} on {where} did not finish in {timeout} s:\n{expired.output}")
    if expect_success and result.returncode != 0:
        pytest.fail(f"{function.__name__} on {where} failed (exit {result.returncode}):\n{result.stdout}")
    return result


def run_alone(function, *args, timeout=60, env=None):
    """Run `function` as a plain `python script.py` process, without mpirun: a job of size 1."""
    command = [sys.executable, "-u", str(TESTS / "rank_main.py"), function.__code__.co_filename, function.__name__,
               *map(str, args)]
    try:
        result = launcher.run(command, env={**os.environ, **(env or {})}, timeout=timeout, capture=True)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{function.__name__} alone did not finish in {timeout} s:\n{expired.output}")
    if result.returncode != 0:
        pytest.fail(f"{function.__name__} alone failed (exit {result.returncode}):\n{result.stdout}")
    return result


@pytest.fixture
def mpirun():
    return run_ranks


@pytest.fixture
def alone():
    return run_alone
