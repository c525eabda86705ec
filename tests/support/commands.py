"""The commands as a user runs them: `hvdtrain` in a subprocess (or in the test's own process, for
what ends before any rank starts), a run crashed to be resumed, and what a run leaves."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrain.launch import mpirun
from hvdtrain.reporting.run_log import read_history
from hvdtrain.training import checkpoint


def run_hvdtrain(*args, cwd=None, env=None, timeout=240):
    """`hvdtrain ARGS` in a subprocess, as a user runs it (a hang fails the test, not the suite)."""
    return run_command([sys.executable, "-m", "hvdtrain.launch.cli", *map(str, args)], cwd=cwd, env=env,
                       timeout=timeout)


def no_launch(monkeypatch):
    """A refusal that regressed must not start a job from inside the test process."""
    def launch(command, **options):
        raise AssertionError(f"launched {command}")

    monkeypatch.setattr(mpirun, "started", launch)


def hvdtrain_here(*args, monkeypatch, cwd=None):
    """`hvdtrain ARGS` run in this process, for what it decides before anything is launched (a
    refused command line, a dry run): the CompletedProcess a subprocess would give, in a fraction
    of its time. Of Hydra's state, only the layouts that earlier calls put in its ConfigStore
    (compose.register_layouts) would change the result, as Hydra lists them among the allowed
    clusters: they are taken out first, as a new process starts without them."""
    from hydra.core.config_store import ConfigStore

    from hvdtrain.launch import cli
    from hvdtrain.launch.compose import LAYOUT

    clusters = ConfigStore.instance().repo.get("cluster", {})
    for name in [name for name in clusters if LAYOUT.fullmatch(name.removesuffix(".yaml"))]:
        del clusters[name]
    if cwd is not None:
        monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["hvdtrain", *map(str, args)])
    stdout, stderr = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            cli.main()
        except SystemExit as exit:
            status = exit.code or 0
    return subprocess.CompletedProcess(["hvdtrain", *args], status, stdout.getvalue(), stderr.getvalue())


def run_command(command, cwd=None, env=None, timeout=240):
    """`command` in a subprocess of its own session, all of which is killed if it runs past
    `timeout` (which fails the test)."""
    command = [str(part) for part in command]
    process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def processes_mentioning(text):
    """Pids of live processes whose command line contains `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def start_and_kill(run_dir, *args, until, timeout=240):
    """Start `hvdtrain ARGS` into run_dir, and kill all its processes at once (a crash) as soon as
    `until()` returns something true, which is returned."""
    with open(run_dir.parent / "killed.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.cli", *args, f"hydra.run.dir={run_dir}"],
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    observed = None

    def observe():
        nonlocal observed
        observed = until()
        return observed

    try:
        wait_until(observe, timeout, "the moment to kill the run")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        for pid in processes_mentioning(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
        process.wait()
    wait_until(lambda: not processes_mentioning(str(run_dir)), 30, "the killed ranks to be gone")
    return observed


def crash_and_resume(run_dir, *args, resume_args=(), timeout=240):
    """Run `hvdtrain ARGS` into run_dir and kill it as soon as it has written two checkpoints; cut
    the newest one short, as if the disk had lost its end; then `hvdtrain resume=RUN_DIR
    RESUME_ARGS`, which skips that checkpoint and goes on from the one before. Returns what the
    resume printed."""
    start_and_kill(run_dir, *args, until=lambda: len(list((run_dir / "checkpoints").glob("step-*.ckpt"))) >= 2,
                   timeout=timeout)
    results = run_dir / "results.json"
    assert not results.exists() or json.loads(results.read_text())["epochs_completed"] < 12, \
        "the run ended before it could be killed"

    newest = sorted((run_dir / "checkpoints").glob("step-*.ckpt"))[-1]
    newest.write_bytes(newest.read_bytes()[:1000])
    result = run_hvdtrain(f"resume={run_dir}", *resume_args, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"skipping checkpoint {newest}" in result.stderr
    assert "hvdtrain: resuming at epoch" in result.stdout
    return result


def newest_checkpoint(run_dir, decode):
    """A run's newest checkpoint, its framework's state decoded by `decode`, metadata merged in."""
    return checkpoint.read(sorted((run_dir / "checkpoints").glob("step-*.ckpt"))[-1], decode)


def results_of(run_dir):
    return json.loads((run_dir / "results.json").read_text())


def assert_the_figures_divide(results, samples_trained):
    """The throughput figures of results.json are what their names say: samples trained over the
    reported seconds (hvdtrain/reporting/report.py)."""
    assert results["samples_trained"] == samples_trained
    assert 0 < results["train_time_s"] < results["wall_time_s"]
    assert results["train_samples_per_s"] == pytest.approx(samples_trained / results["train_time_s"], rel=1e-12)
    assert results["wall_samples_per_s"] == pytest.approx(samples_trained / results["wall_time_s"], rel=1e-12)
    assert results["samples_per_s"] == results["train_samples_per_s"]


def history(run_dir):
    """A run's metrics.jsonl without the throughput, which differs from run to run."""
    return [{key: value for key, value in record.items() if key != "samples_per_s"}
            for record in read_history(run_dir / "metrics.jsonl")]
