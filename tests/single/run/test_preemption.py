"""A scheduler's notice (hvdtrain/run/preemption.py): which signals stop a run, and which of them
also ask for its Slurm job to be requeued."""

import signal

from hvdtrain.run import preemption

# Hydra's submitit launcher asks Slurm for its own signal ahead of the time limit
SUBMITIT = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "7"}


def test_the_preempt_signal_asks_for_a_requeue():
    assert preemption.requeue_signal_names("USR1", {}) == ["SIGUSR1"]


def test_without_a_preempt_signal_nothing_asks_for_a_requeue():
    assert preemption.requeue_signal_names(None, {}) == []


def test_under_submitit_its_signal_asks_for_a_requeue_too():
    assert preemption.requeue_signal_names("USR1", SUBMITIT) == ["SIGUSR1", "SIGUSR2"]


def test_outside_slurm_sigterm_is_not_watched():
    assert preemption.watched_signals("USR1", {}) == [signal.SIGUSR1]  # SIGTERM is how mpirun stops its ranks


def test_inside_slurm_sigterm_is_watched():
    assert preemption.watched_signals("USR1", SUBMITIT) == [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM]
