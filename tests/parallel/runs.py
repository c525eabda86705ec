"""The training runs that tests of several modules read, and how to start, interrupt and compare
them (the fixtures that run them: conftest.py).

Starting the ranks of a run takes far longer than training them (the digits recipe's 12 epochs
take a few seconds), so what keeps these tests short is fewer launches, not fewer epochs: a run
interrupted is the default recipe, compared with the default run itself.

RUN is the default recipe with a checkpoint at every logged step (5, 10, ...), since each comes
more than train.checkpoint_every_s after the one before, all of them kept, and restarts after half
a second; none of that changes what it trains, which ends with the weights and history of the
default run. CONSTANT trains at a constant LR, which an extension trains on as if it had been
started with its new epochs, with RUN's checkpoints."""

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.commands import history, newest_checkpoint, processes_mentioning, wait_until

TIMEOUT = 240
CHECKPOINT_EVERY_LOGGED_STEP = ("train.checkpoint_every_s=0.000001", "train.keep_checkpoints=100")
RUN = (*CHECKPOINT_EVERY_LOGGED_STEP, "fault.restart_wait_s=0.5")
RUN_STEPS = 12 * 22
CONSTANT = ("schedule=constant", "train.epochs=3", *CHECKPOINT_EVERY_LOGGED_STEP)
SLURM_JOB = {"SLURM_JOB_ID": "4711", "SLURM_RESTART_COUNT": "0"}  # the first start of a Slurm job


def torch_state(data):
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def assert_same_weights(run_dir, expected_dir, global_step):
    """The newest checkpoints of two runs are of `global_step` and hold the same weights and
    momentum buffers, bit for bit."""
    import torch

    resumed, expected = (newest_checkpoint(d, torch_state) for d in (run_dir, expected_dir))
    assert resumed["global_step"] == expected["global_step"] == global_step
    for name, tensor in expected["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    for index, state in expected["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"])


def training_history(run_dir):
    """A run's metrics.jsonl without the throughput, the restarts and the preemptions."""
    return [record for record in history(run_dir) if record["event"] not in ("restart", "preempted")]


def rank_pid(run_dir, rank):
    """The pid of rank `rank` of the job training into run_dir."""
    for pid in processes_mentioning(f"hvdtrain.training.worker\0{run_dir}"):
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environment:
            return pid
    return None


def running(pid):
    """Whether `pid` is a live process (a zombie, dead but not yet reaped by init, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_hvdtrain(run_dir, *args, env=None):
    """`hvdtrain ARGS hydra.run.dir=RUN_DIR` started, its output going to a log of its own beside
    run_dir."""
    sessions = len(list(run_dir.parent.glob(f"{run_dir.name}.*.log")))
    log = open(run_dir.parent / f"{run_dir.name}.{sessions}.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.cli", *args, f"hydra.run.dir={run_dir}"],
                               stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    return process, log


def finish(process, log, run_dir):
    """(exit status, what the command printed), once it has ended by itself; no process of its
    job is left."""
    try:
        process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        for pid in processes_mentioning(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"hvdtrain did not finish in {TIMEOUT} s")
    log.seek(0)
    output = log.read()
    assert not processes_mentioning(str(run_dir)), output
    return process.returncode, output


def checkpointed(run_dir, step):
    """Whether the run has a checkpoint of `step` or later."""
    return any(int(path.stem[5:]) >= step for path in (run_dir / "checkpoints").glob("step-*.ckpt"))


def send_after_a_checkpoint(process, run_dir, step, rank, sent, not_pid=None):
    """Once the run that `process` (the `hvdtrain` command) trains into run_dir has checkpointed
    `step` or later, send `sent` to rank `rank` of its job (to the command where rank is None),
    a rank other than the process `not_pid`; returns the pid it was sent to."""
    wait_until(lambda: checkpointed(run_dir, step) or process.poll() is not None, 120, f"a checkpoint of step {step}")
    assert process.poll() is None, "the run ended before it could be interrupted"
    if rank is None:
        pid = process.pid
    else:
        wait_until(lambda: rank_pid(run_dir, rank) not in (None, not_pid), 120, f"rank {rank} to run")
        pid = rank_pid(run_dir, rank)
    os.kill(pid, sent)
    return pid
