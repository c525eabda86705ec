"""`hvdtrain` supervises the job it launched (hvdtrain/launch/supervisor.py), on real runs: an
uninterrupted run records no restart and leaves no heartbeat; a rank killed by a real SIGKILL,
and then one frozen by SIGSTOP, are each met with a restart from the newest checkpoint, and the
run ends with the weights and history of the uninterrupted default run; Ctrl-C leaves no process
of the job behind and is not restarted; a rank's Python exception is not restarted. The
supervisor's decisions on stand-in jobs: tests/single/launch/test_supervisor.py."""

import signal
from types import SimpleNamespace

import pytest

from hvdtrain.core import exits
from hvdtrain.launch import supervisor
from hvdtrain.run import run_dir as run_dir_files

from support.commands import processes_mentioning, results_of, wait_until

from parallel.runs import (RUN, RUN_STEPS, assert_same_weights, finish, rank_pid, running, send_after_a_checkpoint,
                           start_hvdtrain, training_history)


def test_an_uninterrupted_run_records_no_restart(constant_run):
    _, run_dir, _ = constant_run
    assert results_of(run_dir)["restarts"] == []


def test_a_finished_run_leaves_no_heartbeat(constant_run):
    _, run_dir, _ = constant_run
    assert not (run_dir / run_dir_files.HEARTBEAT).exists()


@pytest.fixture(scope="module")
def killed_then_frozen(tmp_path_factory):
    """RUN with fault.stall_shutdown_s=3 whose rank 1 is killed by a real SIGKILL once it has
    checkpointed step 30, and, restarted, whose new rank 1 is frozen by SIGSTOP once it has
    checkpointed step 100; restarted again, it runs to its end. One run meets both, as each start
    of its ranks takes longer than its training."""
    run_dir = tmp_path_factory.mktemp("killed_then_frozen") / "run"
    process, log = start_hvdtrain(run_dir, *RUN, "fault.stall_shutdown_s=3")
    killed = send_after_a_checkpoint(process, run_dir, 30, 1, signal.SIGKILL)
    frozen = send_after_a_checkpoint(process, run_dir, 100, 1, signal.SIGSTOP, not_pid=killed)
    status, output = finish(process, log, run_dir)
    return SimpleNamespace(status=status, output=output, killed=killed, frozen=frozen, run_dir=run_dir,
                           restarts=results_of(run_dir)["restarts"])


def test_a_job_with_a_rank_killed_and_then_one_frozen_finishes(killed_then_frozen):
    assert killed_then_frozen.status == 0, killed_then_frozen.output


def test_a_rank_killed_by_sigkill_is_restarted_saying_why(killed_then_frozen):
    assert ("hvdtrain: a rank was killed by SIGKILL (mpirun exit status 137); restart 1 of 3 in 0.5 s from step"
            in killed_then_frozen.output)


def test_the_restarted_job_resumes_mid_epoch(killed_then_frozen):
    assert "hvdtrain: resuming at epoch 1, step" in killed_then_frozen.output


def test_each_restart_is_recorded(killed_then_frozen):
    assert [restart["attempt"] for restart in killed_then_frozen.restarts] == [1, 2]


def test_the_restart_after_a_kill_is_recorded_with_its_reason(killed_then_frozen):
    restart = killed_then_frozen.restarts[0]
    assert (restart["attempt"], restart["reason"]) == (1, "a rank was killed by SIGKILL (mpirun exit status 137)")


def test_the_restart_after_a_kill_is_recorded_with_its_step_and_the_steps_lost(killed_then_frozen):
    restart = killed_then_frozen.restarts[0]
    assert restart["step"] >= 30 and restart["steps_lost"] >= 0


def test_a_frozen_rank_is_stopped_by_the_stall_limit(killed_then_frozen):
    reason = killed_then_frozen.restarts[1]["reason"]
    assert reason.startswith("the job made no training step for ")
    assert reason.endswith(" s (fault.stall_shutdown_s=3) and was stopped")


def test_a_stalled_job_is_stopped_within_the_limit_and_its_grace(killed_then_frozen):
    reason = killed_then_frozen.restarts[1]["reason"]
    seconds = float(reason.split(" for ")[1].split(" s ")[0])
    assert 3 + supervisor.stall_grace_s(3) <= seconds < 3 + supervisor.stall_grace_s(3) + 5


def test_a_restarted_run_ends_with_the_uninterrupted_weights(killed_then_frozen, default_run):
    assert_same_weights(killed_then_frozen.run_dir, default_run[0], RUN_STEPS)


def test_a_restarted_run_ends_with_the_uninterrupted_history(killed_then_frozen, default_run):
    assert training_history(killed_then_frozen.run_dir) == training_history(default_run[0])


def test_the_report_lists_the_restarts(killed_then_frozen):
    assert "## Restarts" in (killed_then_frozen.run_dir / "report.md").read_text()


def test_the_killed_rank_is_gone(killed_then_frozen):
    assert not running(killed_then_frozen.killed)


def test_the_frozen_rank_is_gone(killed_then_frozen):
    assert not running(killed_then_frozen.frozen)


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
    _, result, _ = failing_run
    assert result.returncode == exits.EXIT_RANK_ERROR, result.stdout + result.stderr


def test_an_error_on_the_ranks_is_not_restarted(failing_run):
    _, result, _ = failing_run
    assert "restart 1" not in result.stdout + result.stderr


def test_an_error_on_the_ranks_says_why_it_is_not_restarted_and_how_to_continue(failing_run):
    run_dir, result, _ = failing_run
    assert "hvdtrain: the workers failed (mpirun exit status 3)" in result.stderr
    assert ("a rank raised an error that a restart would meet again, so the job is not restarted; their errors are "
            f"above. It wrote no checkpoint; start it again with: hvdtrain resume={run_dir}") in result.stderr


def test_a_failed_job_leaves_no_process(failing_run):
    run_dir, _, _ = failing_run
    assert not processes_mentioning(str(run_dir))
