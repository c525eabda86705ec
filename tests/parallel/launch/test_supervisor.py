"""`hvdtrain` supervises the job it launched (hvdtrain/launch/supervisor.py), on real runs: a rank
killed by a real SIGKILL, or frozen by SIGSTOP, is met with a restart from the newest checkpoint
that ends with the weights of the uninterrupted default run; Ctrl-C leaves no process of the job behind
and is not restarted; a rank's Python exception is not restarted. The supervisor's decisions on
stand-in jobs: tests/single/launch/test_supervisor.py."""

import signal
from types import SimpleNamespace

import pytest

from hvdtrain.core import exits
from hvdtrain.launch import supervisor
from hvdtrain.run import run_dir as run_dir_files

from support.commands import processes_mentioning, results_of, wait_until

from parallel.runs import (RUN, RUN_STEPS, assert_same_weights, finish, interrupt_after_a_checkpoint, rank_pid,
                           running, start_hvdtrain, training_history)


def test_an_uninterrupted_run_records_no_restart(constant_run):
    _, run_dir, _ = constant_run
    assert results_of(run_dir)["restarts"] == []


def test_a_finished_run_leaves_no_heartbeat(constant_run):
    _, run_dir, _ = constant_run
    assert not (run_dir / run_dir_files.HEARTBEAT).exists()


def interrupted_rank_1(run_dir, *args, sent):
    """RUN whose rank 1 got `sent` once it had checkpointed step 30, run to its end: its exit
    status, output, rank 1's pid and run directory."""
    status, output, pid = interrupt_after_a_checkpoint(run_dir, *args, rank=1, sent=sent)
    return SimpleNamespace(status=status, output=output, pid=pid, run_dir=run_dir)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """RUN whose rank 1 got a SIGKILL once it had checkpointed step 30."""
    return interrupted_rank_1(tmp_path_factory.mktemp("killed") / "run", sent=signal.SIGKILL)


def test_a_job_with_a_rank_killed_by_sigkill_finishes(killed):
    assert killed.status == 0, killed.output


def test_a_rank_killed_by_sigkill_is_restarted_saying_why(killed):
    assert "hvdtrain: a rank was killed by SIGKILL (mpirun exit status 137); restart 1 of 3 in 0.5 s from step" in killed.output


def test_the_restarted_job_resumes_mid_epoch(killed):
    assert "hvdtrain: resuming at epoch 1, step" in killed.output


def test_the_restart_is_recorded_with_its_reason(killed):
    run_dir = killed.run_dir
    [restart] = results_of(run_dir)["restarts"]
    assert (restart["attempt"], restart["reason"]) == (1, "a rank was killed by SIGKILL (mpirun exit status 137)")


def test_the_restart_is_recorded_with_its_step_and_the_steps_lost(killed):
    run_dir = killed.run_dir
    [restart] = results_of(run_dir)["restarts"]
    assert restart["step"] >= 30 and restart["steps_lost"] >= 0


def test_a_run_restarted_after_a_sigkill_ends_with_the_uninterrupted_weights(killed, default_run):
    run_dir = killed.run_dir
    assert_same_weights(run_dir, default_run[0], RUN_STEPS)


def test_a_run_restarted_after_a_sigkill_ends_with_the_uninterrupted_history(killed, default_run):
    run_dir = killed.run_dir
    assert training_history(run_dir) == training_history(default_run[0])


def test_the_report_lists_the_restarts(killed):
    run_dir = killed.run_dir
    assert "## Restarts" in (run_dir / "report.md").read_text()


def test_the_killed_rank_is_gone(killed):
    assert not running(killed.pid)


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """RUN with fault.stall_shutdown_s=3 whose rank 1 got a SIGSTOP once it had checkpointed step 30."""
    return interrupted_rank_1(tmp_path_factory.mktemp("frozen") / "run", "fault.stall_shutdown_s=3",
                              sent=signal.SIGSTOP)


def test_a_job_with_a_frozen_rank_finishes(frozen):
    assert frozen.status == 0, frozen.output


def test_a_frozen_rank_is_stopped_by_the_stall_limit(frozen):
    run_dir = frozen.run_dir
    [restart] = results_of(run_dir)["restarts"]
    assert restart["reason"].startswith("the job made no training step for ")
    assert restart["reason"].endswith(" s (fault.stall_shutdown_s=3) and was stopped")


def test_a_stalled_job_is_stopped_within_the_limit_and_its_grace(frozen):
    run_dir = frozen.run_dir
    [restart] = results_of(run_dir)["restarts"]
    seconds = float(restart["reason"].split(" for ")[1].split(" s ")[0])
    assert 3 + supervisor.stall_grace_s(3) <= seconds < 3 + supervisor.stall_grace_s(3) + 5


def test_a_run_restarted_after_a_stall_ends_with_the_uninterrupted_weights(frozen, default_run):
    run_dir = frozen.run_dir
    assert_same_weights(run_dir, default_run[0], RUN_STEPS)


def test_the_frozen_rank_is_gone(frozen):
    assert not running(frozen.pid)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A long run sent SIGINT once both ranks train: its exit status, output, ranks' pids and run
    directory."""
    run_dir = tmp_path_factory.mktemp("interrupted") / "run"
    process, log = start_hvdtrain(run_dir, *RUN, "train.epochs=200")
    wait_until(lambda: rank_pid(run_dir, 0) and rank_pid(run_dir, 1) and (run_dir / run_dir_files.HEARTBEAT).exists(),
               120, "the ranks to train")
    ranks = [rank_pid(run_dir, 0), rank_pid(run_dir, 1)]
    process.send_signal(signal.SIGINT)
    status, output = finish(process, log, run_dir)
    return SimpleNamespace(status=status, output=output, ranks=ranks, run_dir=run_dir)


def test_ctrl_c_ends_hvdtrain_with_status_130(interrupted):
    assert interrupted.status == 130, interrupted.output


def test_ctrl_c_says_how_to_continue(interrupted):
    assert f"hvdtrain: interrupted; continue with: hvdtrain resume={interrupted.run_dir}" in interrupted.output


def test_ctrl_c_is_not_restarted(interrupted):
    assert "; restart 1 of" not in interrupted.output


def test_ctrl_c_stops_the_whole_job(interrupted):
    assert not any(running(pid) for pid in interrupted.ranks)


def test_an_error_on_the_ranks_ends_the_job_with_its_status(failing_run):
    _, result = failing_run
    assert result.returncode == exits.EXIT_RANK_ERROR, result.stdout + result.stderr


def test_an_error_on_the_ranks_is_not_restarted(failing_run):
    _, result = failing_run
    assert "restart 1" not in result.stdout + result.stderr


def test_an_error_on_the_ranks_says_why_it_is_not_restarted_and_how_to_continue(failing_run):
    run_dir, result = failing_run
    assert "hvdtrain: the workers failed (mpirun exit status 3)" in result.stderr
    assert ("a rank raised an error that a restart would meet again, so the job is not restarted; their errors are "
            f"above. Continue from the last checkpoint with: hvdtrain resume={run_dir}") in result.stderr


def test_a_failed_job_leaves_no_process(failing_run):
    run_dir, _ = failing_run
    assert not processes_mentioning(str(run_dir))
