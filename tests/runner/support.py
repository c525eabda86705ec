"""What the runner's tests share: composing a config as `hvdtrain` does, running the command,
crashing a run to resume it, and reading what a run leaves."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrain.runner.config import CONF_DIR, register_configs, register_layouts, typed
from hvdtrain.reporting.run_log import read_history
from hvdtrain.training import checkpoint


def compose(*overrides):
    """The config `hvdtrain OVERRIDES` composes, resolved and typed as the workers see it."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from hvdtrain.runner.cli import register_run_dir_resolver

    register_configs()
    register_layouts(overrides)
    register_run_dir_resolver()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        plain = {key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
                 for key in cfg if key != "hydra"}
    return typed(plain)


def run_hvdtrain(*args, cwd=None, env=None, timeout=240):
    """`hvdtrain ARGS` in a subprocess, as a user runs it (a hang fails the test, not the suite)."""
    return run_command([sys.executable, "-m", "hvdtrain.runner.cli", *map(str, args)], cwd=cwd, env=env,
                       timeout=timeout)


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
        process = subprocess.Popen([sys.executable, "-m", "hvdtrain.runner.cli", *args, f"hydra.run.dir={run_dir}"],
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
