"""What a rank does so that its run outlives its job (hvdtrain/training/fault_tolerance.py), on
real runs: checkpoints come by time at logged steps; a scheduler's notice (train.preempt_signal,
USR1, to any rank, or to the command; inside Slurm SIGTERM too) stops every rank after the same
step with a checkpoint of it, and the job exits 77, not restarted, its results.json saying the
epochs it completed; resumed, the run goes on from that step and ends with the weights and
history of the uninterrupted default run; one stopped after an epoch's last step evaluates on
resume with that step's LR and loss."""

import os
import signal
from types import SimpleNamespace

import pytest

from hvdtrain.core import exits

from hvdtrain.run.preemption import post_notice
from hvdtrain.run.run_dir import HEARTBEAT

from support.commands import assert_the_figures_divide, history, newest_checkpoint, results_of, wait_until

from parallel.runs import (RUN, RUN_STEPS, TIMEOUT, assert_same_weights, finish, send_after_a_checkpoint,
                           start_hvdtrain, torch_state, training_history)


def test_checkpoints_come_by_time_at_logged_steps(constant_run):
    _, run_dir, _ = constant_run
    steps = sorted(int(path.stem[5:]) for path in (run_dir / "checkpoints").glob("step-*.ckpt"))
    assert steps == sorted(set(range(5, 66, 5)) | {22, 44, 66})


NOTICES = ["USR1 to rank 1", "SIGTERM to hvdtrain inside a Slurm job"]


def preemption(process, log, run_dir, step, rank, sent, earlier_records):
    """What the run that `process` trains into run_dir did after `sent` to rank `rank` (the command
    where None) once it had checkpointed `step`: the records of the preemption that were not in
    `earlier_records`, and what it left."""
    send_after_a_checkpoint(process, run_dir, step, rank, sent)
    status, output = finish(process, log, run_dir)
    records = [record for record in history(run_dir) if record["event"] == "preempted"]
    return SimpleNamespace(rank=rank, sent=sent, step=step, status=status, output=output,
                           records=[record for record in records if record not in earlier_records],
                           all_records=records, checkpoint=newest_checkpoint(run_dir, torch_state),
                           results=results_of(run_dir))


@pytest.fixture(scope="module")
def preempted(tmp_path_factory):
    """RUN preempted twice and resumed each time: by USR1 to rank 1 once it has checkpointed step
    30; resumed inside Slurm job 4242, by SIGTERM to the `hvdtrain` command once it has
    checkpointed step 100; resumed again there, to its end. {notice: what the run did after it,
    with `resumed`, what the resume after it said}, and the run's last exit status, output and
    directory. One run meets both notices, as each start of its ranks takes longer than its
    training."""
    run_dir = tmp_path_factory.mktemp("preempted") / "run"
    slurm = {**os.environ, "SLURM_JOB_ID": "4242"}
    process, log = start_hvdtrain(run_dir, *RUN)
    first = preemption(process, log, run_dir, 30, 1, signal.SIGUSR1, [])
    process, log = start_hvdtrain(run_dir, f"resume={run_dir}", env=slurm)
    second = preemption(process, log, run_dir, 100, None, signal.SIGTERM, first.all_records)
    first.resumed = second.output
    process, log = start_hvdtrain(run_dir, f"resume={run_dir}", env=slurm)
    status, output = finish(process, log, run_dir)
    second.resumed = output
    return SimpleNamespace(notices=dict(zip(NOTICES, (first, second))), status=status, output=output, run_dir=run_dir)


@pytest.fixture(params=NOTICES)
def notice(request, preempted):
    """What the run did after one notice."""
    return preempted.notices[request.param]


def test_a_preempted_run_exits_77(notice):
    assert notice.status == exits.EXIT_PREEMPTED, notice.output


def test_a_preempted_run_records_the_notice_once(notice):
    [record] = notice.records
    assert record["signal"] == ("another rank's" if notice.rank else signal.Signals(notice.sent).name)


def test_a_preempted_run_checkpoints_the_step_all_ranks_stopped_after(notice):
    assert notice.checkpoint["global_step"] == notice.records[0]["step"] > notice.step


def test_a_preempted_run_says_it_stopped_with_a_checkpoint(notice):
    assert "hvdtrain: preempted: the job stopped with a checkpoint" in notice.output


def test_a_preempted_run_is_neither_restarted_nor_requeued_where_no_slurm_job_asks(notice):
    assert "restart 1 of" not in notice.output and "requeue" not in notice.output


def test_a_run_stopped_early_reports_the_epochs_it_completed(preempted):
    # On a busy machine the run can be an epoch past the checkpoint the test waited for before the
    # notice reaches it; and an epoch stopped after its last step is evaluated on resume, not before.
    notice = preempted.notices[NOTICES[0]]
    completed = (notice.records[0]["step"] - 1) // 22
    assert (notice.results["epochs_completed"], notice.results["epochs"]) == (completed, 12)
    assert_the_figures_divide(notice.results, samples_trained=completed * 22 * 64)


def test_a_preempted_run_resumes_after_the_step_it_stopped_after(notice):
    epoch, step = divmod(notice.records[0]["step"], 22)
    if step == 0:  # stopped after an epoch's last step: that epoch's evaluation comes first
        epoch, step = epoch - 1, 22
    assert f"hvdtrain: resuming at epoch {epoch}, step {step}" in notice.resumed


def test_a_preempted_run_resumed_runs_to_its_end(preempted):
    assert preempted.status == 0, preempted.output


def test_a_preempted_run_resumed_ends_with_the_uninterrupted_weights(preempted, default_run):
    assert_same_weights(preempted.run_dir, default_run[0], RUN_STEPS)


def test_a_preempted_run_resumed_ends_with_the_uninterrupted_history(preempted, default_run):
    assert training_history(preempted.run_dir) == training_history(default_run[0])


@pytest.fixture(scope="module")
def stopped_at_an_epochs_end(tmp_path_factory):
    """The digits recipe for 2 epochs without warmup (so that the LR changes every step), logging
    only at each epoch's end, given notice (as the command posts it) before its first step, so that
    it stops after epoch 0's last step, then resumed to its end: its history."""
    run_dir = tmp_path_factory.mktemp("epoch_end") / "run"
    process, log = start_hvdtrain(run_dir, "train.epochs=2", "train.log_every_steps=22", "schedule.warmup_epochs=0",
                                  "fault.restart_wait_s=0.5")
    wait_until(lambda: (run_dir / HEARTBEAT).exists(), TIMEOUT, "rank 0's first beat")
    post_notice(run_dir, "SIGUSR1")
    status, output = finish(process, log, run_dir)
    assert status == exits.EXIT_PREEMPTED, output
    process, log = start_hvdtrain(run_dir, f"resume={run_dir}")
    status, output = finish(process, log, run_dir)
    assert status == 0 and "hvdtrain: resuming at epoch 0, step 22" in output, output
    return history(run_dir)


def test_a_run_resumed_at_an_epochs_end_evaluates_with_the_lr_and_loss_of_its_last_step(stopped_at_an_epochs_end):
    [train] = [r for r in stopped_at_an_epochs_end if r["event"] == "train" and r["step"] == 22]
    [evaluation] = [r for r in stopped_at_an_epochs_end if r["event"] == "eval" and r["step"] == 22]
    assert (evaluation["lr"], evaluation["loss"]) == (train["lr"], train["loss"])
