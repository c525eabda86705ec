"""`hvdtrain` supervises the job it launched (hvdtrain/runner/supervisor.py): a rank killed by a
real SIGKILL, or frozen by SIGSTOP, is met with a restart from the newest checkpoint that ends
with the weights of an uninterrupted run; a rank's Python exception is not restarted; Ctrl-C
leaves no process of the job behind; a checkpoint cut short by a kill leaves the one before it
intact. Which exit status means what, and the restart loop's bounds, on real processes too."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from hvdtrain.core.exceptions import HorovodInternalError, TensorMismatchError
from hvdtrain.core import exits
from hvdtrain.launch import supervisor
from hvdtrain.run import job
from hvdtrain.run import run_dir as run_dir_files
from hvdtrain.run.config import ConfigError
from hvdtrain.run.hosts import Host
from hvdtrain.training import checkpoint
from support.commands import history, newest_checkpoint, processes_mentioning, results_of, wait_until
from support.configs import compose

TIMEOUT = 240
# digits on 2 local ranks, 4 epochs of 22 steps; a checkpoint at every logged step (5, 10, ...),
# since each comes more than train.checkpoint_every_s after the one before
RUN = ("train.epochs=4", "train.checkpoint_every_s=0.000001", "train.keep_checkpoints=100",
       "fault.restart_wait_s=0.5")


def torch_state(data):
    import io

    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def assert_same_weights(run_dir, expected_dir):
    import torch

    resumed, expected = (newest_checkpoint(d, torch_state) for d in (run_dir, expected_dir))
    assert resumed["global_step"] == expected["global_step"] == 88
    for name, tensor in expected["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    for index, state in expected["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"])


def training_history(run_dir):
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
    log = open(run_dir.parent / f"{run_dir.name}.log", "a+")
    process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.cli", *args, f"hydra.run.dir={run_dir}"],
                               stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    return process, log


def finish(process, log, run_dir):
    """What the command printed, once it has ended by itself; no process of its job is left."""
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


def interrupt_after_a_checkpoint(run_dir, *args, rank, sent, env=None):
    """Start the run; once it has checkpointed step 30 or later (mid-epoch 2), send `sent` to
    `rank` (the command itself where rank is None). Returns (exit status, output, the pid)."""
    process, log = start_hvdtrain(run_dir, *RUN, *args, env=env)
    checkpoints = run_dir / "checkpoints"
    wait_until(lambda: rank is None or rank_pid(run_dir, rank), 120, "the ranks to start")
    pid = process.pid if rank is None else rank_pid(run_dir, rank)
    wait_until(lambda: any(int(p.stem[5:]) >= 30 for p in checkpoints.glob("step-*.ckpt")) or process.poll() is not None,
               120, "a checkpoint of step 30")
    assert process.poll() is None, "the run ended before it could be interrupted"
    os.kill(pid, sent)
    return (*finish(process, log, run_dir), pid)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    process, log = start_hvdtrain(run_dir, *RUN)
    status, output = finish(process, log, run_dir)
    assert status == 0, output
    return run_dir


def test_checkpoints_come_by_time_at_logged_steps(uninterrupted):
    steps = sorted(int(path.stem[5:]) for path in (uninterrupted / "checkpoints").glob("step-*.ckpt"))
    assert steps == sorted(set(range(5, 88, 5)) | {22, 44, 66, 88})
    assert results_of(uninterrupted)["restarts"] == []
    assert not (uninterrupted / run_dir_files.HEARTBEAT).exists()


def test_a_rank_killed_by_sigkill_is_restarted_and_ends_as_an_uninterrupted_run(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    status, output, killed = interrupt_after_a_checkpoint(run_dir, rank=1, sent=signal.SIGKILL)
    assert status == 0, output
    assert "hvdtrain: a rank was killed by SIGKILL (mpirun exit status 137); restart 1 of 3 in 0.5 s from step" in output
    assert "hvdtrain: resuming at epoch 1, step" in output

    [restart] = results_of(run_dir)["restarts"]
    assert (restart["attempt"], restart["reason"]) == (1, "a rank was killed by SIGKILL (mpirun exit status 137)")
    assert restart["step"] >= 30 and restart["steps_lost"] >= 0
    assert_same_weights(run_dir, uninterrupted)
    assert training_history(run_dir) == training_history(uninterrupted)
    assert "## Restarts" in (run_dir / "report.md").read_text()
    assert not running(killed)


def test_a_frozen_rank_is_stopped_by_the_stall_limit_and_the_run_finishes(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    status, output, frozen = interrupt_after_a_checkpoint(run_dir, "fault.stall_shutdown_s=3", rank=1,
                                                          sent=signal.SIGSTOP)
    assert status == 0, output
    [restart] = results_of(run_dir)["restarts"]
    assert restart["reason"].startswith("the job made no training step for ")
    assert restart["reason"].endswith(" s (fault.stall_shutdown_s=3) and was stopped")
    seconds = float(restart["reason"].split(" for ")[1].split(" s ")[0])
    assert 3 + supervisor.stall_grace_s(3) <= seconds < 3 + supervisor.stall_grace_s(3) + 5
    assert_same_weights(run_dir, uninterrupted)
    assert not running(frozen)


@pytest.mark.parametrize("rank, sent, slurm_job", [(1, signal.SIGUSR1, None), (None, signal.SIGTERM, "4242")],
                         ids=["USR1 to rank 1", "SIGTERM to hvdtrain inside a Slurm job"])
def test_a_preempted_run_stops_with_a_checkpoint_and_resumes_to_the_uninterrupted_weights(
        uninterrupted, tmp_path, rank, sent, slurm_job):
    """train.preempt_signal (USR1) to any rank, or to the command; inside Slurm SIGTERM too: every
    rank stops after the same step, rank 0 checkpoints it, and hvdtrain exits 77, not restarted."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "SLURM_JOB_ID": slurm_job} if slurm_job else None
    status, output, _ = interrupt_after_a_checkpoint(run_dir, rank=rank, sent=sent, env=env)
    assert status == exits.EXIT_PREEMPTED, output
    [preempted] = [record for record in history(run_dir) if record["event"] == "preempted"]
    assert preempted["signal"] == ("another rank's" if rank else signal.Signals(sent).name)
    assert newest_checkpoint(run_dir, torch_state)["global_step"] == preempted["step"] > 30
    assert "hvdtrain: preempted: the job stopped with a checkpoint" in output
    assert "restart 1 of" not in output and "requeue" not in output  # no Slurm job asked for one

    process, log = start_hvdtrain(run_dir, f"resume={run_dir}", env=env)
    status, output = finish(process, log, run_dir)
    assert status == 0, output
    assert f"hvdtrain: resuming at epoch 1, step {preempted['step'] - 22}" in output
    assert_same_weights(run_dir, uninterrupted)
    assert training_history(run_dir) == training_history(uninterrupted)


def test_ctrl_c_stops_the_whole_job_without_a_restart(tmp_path):
    run_dir = tmp_path / "run"
    process, log = start_hvdtrain(run_dir, *RUN, "train.epochs=200")
    wait_until(lambda: rank_pid(run_dir, 0) and rank_pid(run_dir, 1) and (run_dir / run_dir_files.HEARTBEAT).exists(),
               120, "the ranks to train")
    ranks = [rank_pid(run_dir, 0), rank_pid(run_dir, 1)]
    process.send_signal(signal.SIGINT)
    status, output = finish(process, log, run_dir)
    assert status == 130, output
    assert f"hvdtrain: interrupted; continue with: hvdtrain resume={run_dir}" in output
    assert "; restart 1 of" not in output
    assert not any(running(pid) for pid in ranks)


def test_an_error_on_the_ranks_is_not_restarted(image_tree, tmp_path):
    """ImageFolder data with more classes than the model has: every rank raises the same error."""
    run_dir = tmp_path / "run"
    process, log = start_hvdtrain(run_dir, "recipe=resnet50_imagenet", "cluster=local", f"data.root={image_tree}",
                                  "model.num_classes=5", "data.image_size=32", "data.resize_size=32")
    status, output = finish(process, log, run_dir)
    assert status == exits.EXIT_RANK_ERROR, output
    assert "failed: ValueError: data.root=" in output
    assert ("a rank raised an error that a restart would meet again, so the job is not restarted; their errors are "
            f"above. Continue from the last checkpoint with: hvdtrain resume={run_dir}") in output
    assert "restart 1" not in output


# The restart loop on stand-in jobs: real processes that end as a job would.

def job_exiting(status, finished_epochs=None, run_dir=None):
    """A command that ends with `status`, having written results.json with `finished_epochs`."""
    code = ""
    if finished_epochs is not None:
        code = f"open({str(run_dir / 'results.json')!r}, 'w').write('{{\"epochs_completed\": {finished_epochs}}}'); "
    return [sys.executable, "-c", f"{code}import sys; sys.exit({status})"]


def supervise(command, run_dir, *overrides):
    cfg = compose("train.epochs=2", "fault.restart_wait_s=0", *overrides)
    plan = SimpleNamespace(launch_command=command, hosts=[Host("localhost", 2)])
    return supervisor.supervise(cfg, run_dir, plan, dict(os.environ), relaunch=None)


@pytest.mark.parametrize("status, reason", [
    (137, "a rank was killed by SIGKILL (mpirun exit status 137)"),
    (exits.EXIT_COMMUNICATION, "a rank's collectives failed: a peer went away or stalled (exit status 75)"),
    (1, "the workers failed (mpirun exit status 1)"),
])
def test_failures_a_restart_can_fix_are_restarted_up_to_the_limit(tmp_path, capsys, status, reason):
    assert supervise(job_exiting(status), tmp_path, "fault.max_restarts=2") == status
    restarts = [r for r in history(tmp_path) if r["event"] == "restart"]
    assert [(r["attempt"], r["reason"], r["step"]) for r in restarts] == [(1, reason, 0), (2, reason, 0)]
    err = capsys.readouterr().err
    assert f"hvdtrain: {reason}; restart 2 of 2 in 0 s from step 0 (0 steps lost)" in err
    assert (f"hvdtrain: {reason}; restarted 2 times already (fault.max_restarts=2), so it stops here. "
            f"Continue from the last checkpoint with: hvdtrain resume={tmp_path}") in err


@pytest.mark.parametrize("status", [exits.EXIT_CONFIG, exits.EXIT_RANK_ERROR])
def test_failures_a_restart_would_meet_again_are_not_restarted(tmp_path, capsys, status):
    assert supervise(job_exiting(status), tmp_path) == status
    assert not history(tmp_path)
    assert "so the job is not restarted" in capsys.readouterr().err


def test_a_job_that_exits_0_unfinished_is_restarted_and_one_that_finished_is_not(tmp_path, capsys):
    """mpirun has been seen to exit 0 after losing a remote daemon: the run's results.json, not
    mpirun's status, says whether it finished."""
    assert supervise(job_exiting(0, finished_epochs=1, run_dir=tmp_path), tmp_path, "fault.max_restarts=1") == 1
    assert "hvdtrain: mpirun exited 0 but the run finished 1 of 2 epochs; restart 1 of 1" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").unlink()
    assert supervise(job_exiting(0, finished_epochs=2, run_dir=tmp_path), tmp_path) == 0
    assert not history(tmp_path)


def test_the_steps_lost_are_those_since_the_newest_checkpoint(tmp_path):
    metadata = checkpoint.metadata(compose(), epoch=1, step=3, global_step=25, world_size=2, metrics={},
                                   elapsed_s=1.0, train_s=0.5)
    checkpoint.save(tmp_path / "checkpoints", metadata, b"state", keep=3)
    heartbeat = run_dir_files.Heartbeat(tmp_path)
    heartbeat.beat(31)
    restart = supervisor.record_restart(tmp_path, 1, "a test", [Host("a", 2), Host("b", 2)], [Host("a", 2)])
    assert (restart.step, restart.steps_lost) == (25, 6)
    heartbeat.close()
    assert [(r["steps_lost"], r["hosts_before"], r["hosts_after"]) for r in history(tmp_path)] == \
        [(6, ["a:2", "b:2"], ["a:2"])]


def test_ranks_exit_with_a_status_that_says_whether_a_restart_can_help():
    def raised(error, cause=None):
        try:
            try:
                raise cause or error
            except BaseException as first:
                if cause is None:
                    raise
                raise error from first
        except BaseException as final:
            return final

    assert exits.exit_status(raised(HorovodInternalError("peer gone"))) == exits.EXIT_COMMUNICATION
    assert exits.exit_status(raised(RuntimeError("in a hook"), HorovodInternalError("x"))) == 75
    assert exits.exit_status(raised(TensorMismatchError("shapes differ"))) == exits.EXIT_RANK_ERROR
    assert exits.exit_status(raised(ValueError("bad data"))) == exits.EXIT_RANK_ERROR
    assert exits.exit_status(raised(RuntimeError("UnknownError: HorovodInternalError: x"))) == 75


def test_only_jobs_hvdtrain_launched_are_supervised():
    assert job.supervised({})
    assert not job.supervised({"OMPI_COMM_WORLD_SIZE": "2"})  # the user's own mpirun
    assert job.supervised({"OMPI_COMM_WORLD_SIZE": "2", job.SUPERVISED: "1"})
    assert not job.supervised({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"})
    assert supervisor.worker_settings(compose("fault.stall_shutdown_s=90").fault) == {
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90", "HOROVOD_STALL_CHECK_TIME_SECONDS": "60"}
    assert supervisor.worker_settings(compose("fault.stall_shutdown_s=0").fault) == {}


def test_a_kill_while_a_checkpoint_is_written_leaves_the_one_before_intact(tmp_path):
    """The writer is SIGKILLed after it has written the new checkpoint's bytes, before the rename
    that would make it the newest: the old one is what a restart finds, and the next save clears
    the half-written file."""
    directory = tmp_path / "checkpoints"
    script = textwrap.dedent(f"""
        import os, signal
        from hvdtrain.training import checkpoint

        checkpoint.save({str(directory)!r}, {{"global_step": 10}}, b"weights of step 10", keep=3)
        os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.save({str(directory)!r}, {{"global_step": 20}}, b"weights of step 20", keep=3)
    """)
    killed = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert checkpoint.newest_metadata(directory)["global_step"] == 10
    assert checkpoint.read(checkpoint.path_for(directory, 10), lambda state: {"state": state})["state"] == \
        b"weights of step 10"
    checkpoint.save(directory, {"global_step": 30}, b"weights of step 30", keep=3)
    assert sorted(p.name for p in directory.iterdir()) == ["step-000000010.ckpt", "step-000000030.ckpt"]


# A smaller world after lost hosts: the same global batch, or the linear rule where allowed.

THREE_HOSTS = [Host("a", 2), Host("b", 2), Host("c", 2)]


@pytest.mark.parametrize("overrides, changed", [
    ((), {"train.backward_passes_per_step": 3, "train.batch_size": 32}),
    (("fault.keep_global_batch=batch_size",), {"train.backward_passes_per_step": 2, "train.batch_size": 48}),
])
def test_a_smaller_world_keeps_the_global_batch(overrides, changed):
    cfg = compose("cluster=3x2", "train.batch_size=32", "train.backward_passes_per_step=2", "fault.min_hosts=2",
                  *overrides)
    smaller, change = supervisor.resized(cfg, THREE_HOSTS, THREE_HOSTS[:2])
    assert (list(smaller.cluster.hosts), smaller.cluster.num_hosts) == (["a:2", "b:2"], 2)
    assert {key: OmegaConf.select(smaller, key) for key in changed} == changed
    key = next(k for k, v in changed.items() if v != OmegaConf.select(cfg, k))
    assert change == (f"host c does not answer; going on with 2 of 3 hosts, 4 ranks, the global batch of 384 kept by "
                      f"{key}={changed[key]} (it was {OmegaConf.select(cfg, key)})")
    assert checkpoint.compatibility_hash(smaller) == checkpoint.compatibility_hash(cfg)


def test_a_global_batch_that_does_not_divide_is_refused_or_rescaled_where_allowed():
    cfg = compose("cluster=3x2", "train.batch_size=32", "fault.min_hosts=2")  # 192 over 4 ranks: 1.5 passes
    with pytest.raises(ConfigError, match=r"would need train.backward_passes_per_step=192/128 to keep the global "
                                          r"batch of 192, not a whole number; set fault.allow_rescale=true"):
        supervisor.resized(cfg, THREE_HOSTS, THREE_HOSTS[:2])
    cfg.fault.allow_rescale = True
    smaller, change = supervisor.resized(cfg, THREE_HOSTS, THREE_HOSTS[:2])
    assert smaller.train.backward_passes_per_step == 1
    assert change.endswith("the global batch of 192 cannot be kept (fault.allow_rescale=true): 128 from here, at "
                           "the LR the linear rule gives it, 0.2 at the peak instead of 0.3")


def test_too_few_hosts_left_stop_the_run():
    with pytest.raises(ConfigError, match=r"hosts b, c do not answer, and 1 of 3 hosts are fewer than "
                                          r"fault.min_hosts=2 allows"):
        supervisor.resized(compose("cluster=3x2", "fault.min_hosts=2"), THREE_HOSTS, THREE_HOSTS[:1])
    with pytest.raises(ConfigError, match=r"fault.min_hosts=None"):  # by default every host is needed
        supervisor.resized(compose("cluster=3x2"), THREE_HOSTS, THREE_HOSTS[:2])


def test_hosts_are_probed_with_the_agent_mpirun_uses(tmp_path, monkeypatch):
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/bin/sh\ncase $2 in up) exit 0;; slow) exec sleep 30;; *) exit 1;; esac\n")
    agent.chmod(0o755)
    cfg = compose("cluster=4x1", f"cluster.mpirun_args=[--mca,plm_ssh_agent,{agent} extra-word]")
    assert supervisor.remote_agent(cfg.cluster, {}) == [str(agent), "extra-word"]
    assert supervisor.remote_agent(compose().cluster, {"OMPI_MCA_plm_rsh_agent": "rsh -x"}) == ["rsh", "-x"]
    monkeypatch.setattr(supervisor, "PROBE_TIMEOUT_S", 1.0)
    hosts = [Host("localhost", 1), Host("up", 1), Host("down", 1), Host("slow", 1)]
    assert supervisor.reachable_hosts(hosts, cfg.cluster, {}) == hosts[:2]
