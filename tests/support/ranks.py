"""Real ranks for the tests: functions of a test file run under mpirun, each rank with its share
of this machine's cores, every job under a timeout so that a hang fails its tests, not the suite.

`run_ranks` runs one function and fails the test where any rank fails. `RankChecks` runs many
checks, one behaviour each, in one job of N ranks, and hands each test the report of its own
check: starting Python, the framework and MPI costs each job seconds, which one job per world
size pays once for all the checks of a test module.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.launch import mpirun
from support.rank_main import REPORT

RANK_MAIN = Path(__file__).resolve().parent / "rank_main.py"
# A check that fails on one rank before a collective leaves the others waiting in it; the stall
# inspector stops their engine after this long, so that the job ends with the checks' reports.
STALL_SHUTDOWN_S = "60"


def _program(function, *extra):
    return [sys.executable, "-u", str(RANK_MAIN), function.__code__.co_filename, *extra]


def _launch(num_proc, program, timeout, env, hosts, extra_args):
    """Run `program` on `num_proc` ranks: the CompletedProcess; subprocess.TimeoutExpired, with
    the job's output, once `timeout` has passed and the job is stopped."""
    base = dict(os.environ)
    base.update(env or {})
    worker_env = mpirun.worker_environment(num_proc, base)
    command = mpirun.mpirun_command(program, hosts=hosts, num_proc=num_proc, env=worker_env, extra_args=extra_args)
    return mpirun.run(command, env=worker_env, timeout=timeout, capture=True)


def _where(num_proc, hosts):
    return f"{num_proc} ranks" if hosts is None else ",".join(f"{h.host}:{h.slots}" for h in hosts)


def run_ranks(num_proc, function, *args, timeout=120, env=None, expect_success=True, hosts=None, extra_args=()):
    """Run `function` (a module-level function of a test file) on `num_proc` real ranks under
    mpirun (on `hosts`, default this machine)."""
    what = f"{function.__name__} on {_where(num_proc, hosts)}"
    try:
        result = _launch(num_proc, _program(function, function.__name__, *map(str, args)), timeout, env, hosts,
                         extra_args)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{what} did not finish in {timeout} s:\n{expired.output}")
    if expect_success and result.returncode != 0:
        pytest.fail(f"{what} failed (exit {result.returncode}):\n{result.stdout}")
    return result


def run_alone(function, *args, timeout=60, env=None):
    """Run `function` as a plain `python script.py` process, without mpirun: a job of size 1."""
    command = _program(function, function.__name__, *map(str, args))
    try:
        result = mpirun.run(command, env={**os.environ, **(env or {})}, timeout=timeout, capture=True)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{function.__name__} alone did not finish in {timeout} s:\n{expired.output}")
    if result.returncode != 0:
        pytest.fail(f"{function.__name__} alone failed (exit {result.returncode}):\n{result.stdout}")
    return result


class CheckReports:
    """What each rank of one job of checks said of each check."""

    def __init__(self, checks, num_proc, output, ending, what):
        """`ending`: how the job ended, in words ("exit status 0", "stopped after 180 s")."""
        self.names = [check.__name__ for check in checks]
        self.num_proc, self.output, self.ending, self.what = num_proc, output or "", ending, what
        self.outcomes = {}  # name -> {rank: "ok" | "failed"}
        for name, outcome, rank in re.findall(rf"^{REPORT} (\w+) (ok|failed) rank=(\d+)$", self.output, re.MULTILINE):
            self.outcomes.setdefault(name, {})[int(rank)] = outcome

    def assert_passed(self, check):
        """Fail the calling test unless every rank reported `check` ok, saying why."""
        name = check.__name__
        outcomes = self.outcomes.get(name, {})
        failed = sorted(rank for rank, outcome in outcomes.items() if outcome == "failed")
        missing = sorted(set(range(self.num_proc)) - set(outcomes))
        if not failed and not missing:
            return
        earlier = [other for other in self.names[:self.names.index(name)]
                   if "failed" in self.outcomes.get(other, {}).values()]
        lines = [f"{name} on {self.what}: "
                 + (f"failed on rank {', '.join(map(str, failed))}" if failed
                    else f"no report from rank {', '.join(map(str, missing))} (the job ended: {self.ending})")]
        if earlier:
            lines.append(f"(it ran after {', '.join(earlier)} failed, which may have left the ranks out of step)")
        pytest.fail("\n".join(lines) + "\n" + self._output_of(name, failed))

    def _output_of(self, name, ranks):
        """The job's output, or where some ranks failed, their traceback lines for this check."""
        if not ranks:
            return self.output
        kept = [line for line in self.output.splitlines()
                if any(line.startswith(f"[rank {rank}] ") for rank in ranks)]
        return "\n".join(kept) or self.output


class RankChecks:
    """Jobs of checks for one test module, each run once however many tests read it."""

    def __init__(self):
        self.jobs = {}

    def run(self, num_proc, checks, *args, timeout=180, env=None, hosts=None, extra_args=()):
        """The reports of `checks` (module-level functions of one test file) run in turn on
        `num_proc` ranks, with `args` and `env`; the job runs at the first call and is kept."""
        key = (num_proc, tuple(check.__name__ for check in checks), args, tuple(sorted((env or {}).items())),
               tuple(hosts or ()), tuple(extra_args))
        return self._job(key, checks, args, env, timeout, num_proc, _where(num_proc, hosts),
                         lambda program, env: _launch(num_proc, program, timeout, env, hosts, extra_args))

    def alone(self, checks, *args, timeout=180, env=None):
        """The reports of `checks` run in turn in one plain `python` process, without mpirun (a
        job of size 1, as run_alone runs one function); the job runs at the first call and is kept."""
        key = ("alone", tuple(check.__name__ for check in checks), args, tuple(sorted((env or {}).items())))
        return self._job(key, checks, args, env, timeout, 1, "one process without mpirun",
                         lambda program, env: mpirun.run(program, env={**os.environ, **env}, timeout=timeout,
                                                         capture=True))

    def _job(self, key, checks, args, env, timeout, num_proc, what, launch):
        if key not in self.jobs:
            env = {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": STALL_SHUTDOWN_S, **(env or {})}
            program = _program(checks[0], "--checks", ",".join(check.__name__ for check in checks), *map(str, args))
            try:
                result = launch(program, env)
                output, ending = result.stdout, f"exit status {result.returncode}"
            except subprocess.TimeoutExpired as expired:
                output, ending = expired.output, f"stopped after {timeout} s"
            self.jobs[key] = CheckReports(checks, num_proc, output, ending, what)
        return self.jobs[key]
