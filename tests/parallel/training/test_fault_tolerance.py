"""What a rank does so that its run outlives its job (hvdtrain/training/fault_tolerance.py), on
real runs: checkpoints come by time at logged steps; a scheduler's notice (train.preempt_signal,
USR1, to any rank, or to the command; inside Slurm SIGTERM too) stops every rank after the same
step with a checkpoint of it, and the job exits 77, not restarted, its results.json saying the
epochs it completed; resumed, the run ends with the weights and history of the uninterrupted
default run."""

import os
import signal
from types import SimpleNamespace

import pytest

from hvdtrain.core import exits

from support.commands import assert_the_figures_divide, history, newest_checkpoint, results_of

from parallel.runs import (RUN_STEPS, assert_same_weights, finish, interrupt_after_a_checkpoint, start_hvdtrain,
                           torch_state, training_history)


def test_checkpoints_come_by_time_at_logged_steps(constant_run):
    _, run_dir, _ = constant_run
    steps = sorted(int(path.stem[5:]) for path in (run_dir / "checkpoints").glob("step-*.ckpt"))
    assert steps == sorted(set(range(5, 66, 5)) | {22, 44, 66})


@pytest.fixture(scope="module", params=[(1, signal.SIGUSR1, None), (None, signal.SIGTERM, "4242")],
                ids=["USR1 to rank 1", "SIGTERM to hvdtrain inside a Slurm job"])
def preempted(request, tmp_path_factory):
    """RUN sent a notice once it has checkpointed step 30 (to a rank, or to the command where
    rank is None), then resumed: what the preempted run left and said, and what its resume did."""
    rank, sent, slurm_job = request.param
    run_dir = tmp_path_factory.mktemp("preempted") / "run"
    env = {**os.environ, "SLURM_JOB_ID": slurm_job} if slurm_job else None
    status, output, _ = interrupt_after_a_checkpoint(run_dir, rank=rank, sent=sent, env=env)
    stopped = SimpleNamespace(
        rank=rank, sent=sent, status=status, output=output, run_dir=run_dir,
        records=[record for record in history(run_dir) if record["event"] == "preempted"],
        checkpoint=newest_checkpoint(run_dir, torch_state), results=results_of(run_dir))
    process, log = start_hvdtrain(run_dir, f"resume={run_dir}", env=env)
    stopped.resumed_status, stopped.resumed_output = finish(process, log, run_dir)
    return stopped


def test_a_preempted_run_exits_77(preempted):
    assert preempted.status == exits.EXIT_PREEMPTED, preempted.output


def test_a_preempted_run_records_the_notice_once(preempted):
    [record] = preempted.records
    assert record["signal"] == ("another rank's" if preempted.rank else signal.Signals(preempted.sent).name)


def test_a_preempted_run_checkpoints_the_step_all_ranks_stopped_after(preempted):
    assert preempted.checkpoint["global_step"] == preempted.records[0]["step"] > 30


def test_a_preempted_run_says_it_stopped_with_a_checkpoint(preempted):
    assert "hvdtrain: preempted: the job stopped with a checkpoint" in preempted.output


def test_a_preempted_run_is_neither_restarted_nor_requeued_where_no_slurm_job_asks(preempted):
    assert "restart 1 of" not in preempted.output and "requeue" not in preempted.output


def test_a_run_stopped_early_reports_the_epochs_it_completed(preempted):
    assert (preempted.results["epochs_completed"], preempted.results["epochs"]) == (1, 12)
    assert_the_figures_divide(preempted.results, samples_trained=22 * 64)


def test_a_preempted_run_resumes_after_the_step_it_stopped_after(preempted):
    assert preempted.resumed_status == 0, preempted.resumed_output
    assert f"hvdtrain: resuming at epoch 1, step {preempted.records[0]['step'] - 22}" in preempted.resumed_output


def test_a_preempted_run_resumed_ends_with_the_uninterrupted_weights(preempted, default_run):
    assert_same_weights(preempted.run_dir, default_run[0], RUN_STEPS)


def test_a_preempted_run_resumed_ends_with_the_uninterrupted_history(preempted, default_run):
    assert training_history(preempted.run_dir) == training_history(default_run[0])
