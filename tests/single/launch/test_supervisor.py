"""The supervisor's decisions (hvdtrain/launch/supervisor.py), on stand-in jobs (real processes
that end as a job would) and configs: failures a restart can fix are restarted up to the limit,
those a restart would meet again are not; a job that exits 0 unfinished is restarted; a restart
loses the steps since the newest checkpoint; a job quiet in its training steps is stopped, one
quiet outside them or exiting is not; the ranks' stall settings; a smaller world after
lost hosts keeps the global batch, or rescales it where allowed, or stops; a host back within the
restart's wait keeps its place. Real jobs supervised: tests/parallel/launch/test_supervisor.py."""

import contextlib
import io
import os
import sys
import time
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from hvdtrain.core import exits
from hvdtrain.launch import supervisor
from hvdtrain.run import run_dir as run_dir_files
from hvdtrain.run.config import ConfigError
from hvdtrain.run.hosts import Host
from hvdtrain.training import checkpoint

from support.commands import history
from support.configs import compose


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


RESTARTED = {
    137: "a rank was killed by SIGKILL (mpirun exit status 137)",
    exits.EXIT_COMMUNICATION: "a rank's collectives failed: a peer went away or stalled (exit status 75)",
    1: "the workers failed (mpirun exit status 1)",
}


@pytest.fixture(scope="module")
def restarted_to_the_limit(tmp_path_factory):
    """supervised(status): (what the supervisor returned for a job that always ends with
    `status`, allowed 2 restarts, the restarts recorded in its run directory, what it said on
    stderr, the run directory, what it said on stdout, where rank 0 prints the plan); each status
    supervised once."""
    seen = {}

    def supervised(status):
        if status not in seen:
            run_dir = tmp_path_factory.mktemp("supervised")
            with contextlib.redirect_stderr(io.StringIO()) as said, contextlib.redirect_stdout(io.StringIO()) as out:
                returned = supervise(job_exiting(status), run_dir, "fault.max_restarts=2")
            restarts = [r for r in history(run_dir) if r["event"] == "restart"]
            seen[status] = returned, restarts, said.getvalue(), run_dir, out.getvalue()
        return seen[status]

    return supervised


@pytest.mark.parametrize("status", RESTARTED)
def test_failures_a_restart_can_fix_end_with_their_status_after_the_last_restart(restarted_to_the_limit, status):
    returned, _, _, _, _ = restarted_to_the_limit(status)
    assert returned == status


@pytest.mark.parametrize("status", RESTARTED)
def test_failures_a_restart_can_fix_are_restarted_up_to_the_limit(restarted_to_the_limit, status):
    _, restarts, _, _, _ = restarted_to_the_limit(status)
    reason = RESTARTED[status]
    assert [(r["attempt"], r["reason"], r["step"]) for r in restarts] == [(1, reason, 0), (2, reason, 0)]


@pytest.mark.parametrize("status", RESTARTED)
def test_each_restart_says_why_and_from_where(restarted_to_the_limit, status):
    _, _, said, _, _ = restarted_to_the_limit(status)
    assert f"hvdtrain: {RESTARTED[status]}; restart 2 of 2 in 0 s from step 0 (0 steps lost)" in said


@pytest.mark.parametrize("status", RESTARTED)
def test_each_restart_says_so_where_the_plan_is_printed_again(restarted_to_the_limit, status):
    *_, out = restarted_to_the_limit(status)
    assert out.splitlines() == [f"hvdtrain: restart {n} of 2: the job starts again from step 0" for n in (1, 2)]


@pytest.mark.parametrize("status", RESTARTED)
def test_the_last_failure_says_how_to_continue(restarted_to_the_limit, status):
    _, _, said, run_dir, _ = restarted_to_the_limit(status)
    assert (f"hvdtrain: {RESTARTED[status]}; restarted 2 times already (fault.max_restarts=2), so it stops here. "
            f"It wrote no checkpoint; start it again with: hvdtrain resume={run_dir}") in said


def test_a_job_that_checkpointed_is_continued_from_its_newest_checkpoint(tmp_path):
    metadata = checkpoint.metadata(compose(), epoch=1, step=3, global_step=25, world_size=2, metrics={},
                                   elapsed_s=1.0, train_s=0.5)
    checkpoint.save(tmp_path / "checkpoints", metadata, b"state", keep=3)
    assert supervisor.resume_advice(tmp_path) == \
        f"Continue from the last checkpoint (step 25) with: hvdtrain resume={tmp_path}"


@pytest.mark.parametrize("status", [exits.EXIT_CONFIG, exits.EXIT_RANK_ERROR])
def test_failures_a_restart_would_meet_again_are_not_restarted(tmp_path, capsys, status):
    assert supervise(job_exiting(status), tmp_path) == status
    assert not history(tmp_path)
    assert "so the job is not restarted" in capsys.readouterr().err


def test_a_job_that_exits_0_unfinished_is_restarted(tmp_path, capsys):
    """mpirun has been seen to exit 0 after losing a remote daemon: the run's results.json, not
    mpirun's status, says whether it finished."""
    assert supervise(job_exiting(0, finished_epochs=1, run_dir=tmp_path), tmp_path, "fault.max_restarts=1") == 1
    assert "hvdtrain: mpirun exited 0 but the run finished 1 of 2 epochs; restart 1 of 1" in capsys.readouterr().err


def test_a_job_that_exits_0_finished_is_not_restarted(tmp_path):
    assert supervise(job_exiting(0, finished_epochs=2, run_dir=tmp_path), tmp_path) == 0
    assert not history(tmp_path)


@pytest.fixture
def restart_after_step_31(tmp_path):
    """(the restart recorded after a job of 2 hosts beat step 31 and lost a host, its newest
    checkpoint of step 25, and the run's history)."""
    metadata = checkpoint.metadata(compose(), epoch=1, step=3, global_step=25, world_size=2, metrics={},
                                   elapsed_s=1.0, train_s=0.5)
    checkpoint.save(tmp_path / "checkpoints", metadata, b"state", keep=3)
    heartbeat = run_dir_files.Heartbeat(tmp_path)
    heartbeat.beat(31)
    restart = supervisor.record_restart(tmp_path, 1, "a test", [Host("a", 2), Host("b", 2)], [Host("a", 2)])
    heartbeat.close()
    return restart, history(tmp_path)


def test_the_steps_lost_are_those_since_the_newest_checkpoint(restart_after_step_31):
    restart, _ = restart_after_step_31
    assert (restart.step, restart.steps_lost) == (25, 6)


def test_a_restart_is_recorded_with_the_hosts_before_and_after(restart_after_step_31):
    _, records = restart_after_step_31
    assert [(r["steps_lost"], r["hosts_before"], r["hosts_after"]) for r in records] == \
        [(6, ["a:2", "b:2"], ["a:2"])]


def test_the_ranks_stall_inspector_stops_them_after_fault_stall_shutdown_s():
    assert supervisor.worker_settings(compose("fault.stall_shutdown_s=90").fault) == {
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90", "HOROVOD_STALL_CHECK_TIME_SECONDS": "60"}


def test_no_stall_shutdown_leaves_the_ranks_stall_inspector_alone():
    assert supervisor.worker_settings(compose("fault.stall_shutdown_s=0").fault) == {}


# Watching a job's heartbeat: a limit of 1 s on training steps (0.5 s and its grace), and 30 s
# outside them, on stand-in jobs that beat as rank 0 does and then go quiet for 3 s.

def job_beating(then, training=True):
    """A command that beats step 7 (`training`: in training steps, or outside them), then runs
    `then` (Python) and stays quiet for 3 s."""
    return [sys.executable, "-c", f"import time; from hvdtrain.run.run_dir import Heartbeat; "
                                  f"beat = Heartbeat('.'); beat.beat(7, training={training}); {then}; time.sleep(3)"]


@pytest.fixture
def watched(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "stall_grace_s", lambda stall_shutdown_s: 0.5)
    monkeypatch.setattr(supervisor, "OUTSIDE_STEPS_S", 30.0)
    monkeypatch.chdir(tmp_path)
    return lambda command: supervisor.watch(command, dict(os.environ), tmp_path, stall_shutdown_s=0.5)


def test_a_job_quiet_in_its_training_steps_is_stopped(watched):
    assert watched(job_beating("pass")).stalled_s > 1


def test_a_job_quiet_outside_its_training_steps_is_not_stopped(watched):
    """Starting, evaluating or writing the report is no stall: a report on a loaded machine has
    taken longer than a test's limit on steps."""
    assert watched(job_beating("pass", training=False)) == supervisor.Outcome(0)


def test_a_job_that_has_finished_its_run_is_not_stopped_while_it_exits(watched):
    assert watched(job_beating("beat.close()")) == supervisor.Outcome(0)


def test_a_beat_says_its_step_and_whether_it_is_in_training_steps(tmp_path):
    heartbeat = run_dir_files.Heartbeat(tmp_path)
    heartbeat.beat(12, training=False)
    beat = run_dir_files.last_beat(tmp_path)
    heartbeat.close()
    assert (beat.global_step, beat.training, run_dir_files.last_beat(tmp_path)) == (12, False, None)


# A smaller world after lost hosts: the same global batch, or the linear rule where allowed.

THREE_HOSTS = [Host("a", 2), Host("b", 2), Host("c", 2)]


@pytest.mark.parametrize("overrides, changed", [
    ((), {"train.backward_passes_per_step": 3, "train.batch_size": 32}),
    (("fault.keep_global_batch=batch_size",), {"train.backward_passes_per_step": 2, "train.batch_size": 48}),
], ids=["by backward passes", "by the batch size"])
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


def test_a_global_batch_that_does_not_divide_is_refused():
    cfg = compose("cluster=3x2", "train.batch_size=32", "fault.min_hosts=2")  # 192 over 4 ranks: 1.5 passes
    with pytest.raises(ConfigError, match=r"would need train.backward_passes_per_step=192/128 to keep the global "
                                          r"batch of 192, not a whole number; set fault.allow_rescale=true"):
        supervisor.resized(cfg, THREE_HOSTS, THREE_HOSTS[:2])


def test_a_global_batch_that_does_not_divide_is_rescaled_where_allowed():
    cfg = compose("cluster=3x2", "train.batch_size=32", "fault.min_hosts=2", "fault.allow_rescale=true")
    smaller, change = supervisor.resized(cfg, THREE_HOSTS, THREE_HOSTS[:2])
    assert smaller.train.backward_passes_per_step == 1
    assert change.endswith("the global batch of 192 cannot be kept (fault.allow_rescale=true): 128 from here, at "
                           "the LR the linear rule gives it, 0.2 at the peak instead of 0.3")


def test_fewer_hosts_left_than_fault_min_hosts_stop_the_run():
    with pytest.raises(ConfigError, match=r"hosts b, c do not answer, and 1 of 3 hosts are fewer than "
                                          r"fault.min_hosts=2 allows"):
        supervisor.resized(compose("cluster=3x2", "fault.min_hosts=2"), THREE_HOSTS, THREE_HOSTS[:1])


def test_by_default_every_host_is_needed():
    with pytest.raises(ConfigError, match=r"fault.min_hosts=None"):
        supervisor.resized(compose("cluster=3x2"), THREE_HOSTS, THREE_HOSTS[:2])


def test_a_host_back_within_the_restarts_wait_keeps_its_place(tmp_path, monkeypatch, capsys):
    """A pod its StatefulSet starts again, a node rebooting: asked again after the wait, it answers."""
    hosts = [Host("a", 2), Host("b", 2)]
    answers = iter([hosts[:1], hosts])
    monkeypatch.setattr(supervisor.mpirun, "reachable_hosts", lambda asked, args, env: next(answers))
    slept = []
    # The supervisor's own time module only: a thread another test left in this process may sleep too.
    monkeypatch.setattr(supervisor, "time", SimpleNamespace(sleep=slept.append, time=time.time))
    cfg = compose("cluster=2x2", "cluster.hosts=[a,b]", "train.epochs=2", "fault.restart_wait_s=7",
                  "fault.max_restarts=1")
    plan = SimpleNamespace(launch_command=job_exiting(137), hosts=hosts)
    assert supervisor.supervise(cfg, tmp_path, plan, dict(os.environ), relaunch=None) == 137
    restart, = [r for r in history(tmp_path) if r["event"] == "restart"]
    assert restart["hosts_after"] == ["a:2", "b:2"]
    assert 7 in slept and sum(s for s in slept if s >= 1) == 7  # the wait asked host b again, once
    assert "restart 1 of 1 in 0 s" in capsys.readouterr().err
