"""A scheduler's notice that a run must stop early: which signals are one, and the notice file
through which the `hvdtrain` command passes one it received on to rank 0.

Slurm gives notice before it ends a job: SIGTERM, with `KillWait` seconds (30 by default) before
SIGKILL, when it preempts, requeues or cancels it or its time is up; and, where a batch script
asks for it (`#SBATCH --signal=USR1@120`), a signal of the user's choice that long before the
time limit. Every rank watches for `train.preempt_signal`, and for SIGTERM inside a Slurm job
(elsewhere SIGTERM is how mpirun stops its ranks); what a rank does on a notice is
hvdtrain/training/fault_tolerance.py's.
"""

import os
import signal
from dataclasses import dataclass
from pathlib import Path

NOTICE_FILE = ".preempt"  # in the run directory: the signal `hvdtrain` received, for rank 0


@dataclass(frozen=True)
class Notice:
    signal_name: str  # "SIGUSR1"
    received_at: float  # time.time()


def requeue_signal_names(preempt_signal, env=None):
    """The signals that ask a run to stop and requeue its Slurm job: `preempt_signal` ("USR1", or
    None), and in a job of Hydra's submitit launcher, submitit's own (it sends USR2 ahead of the
    time limit; its handler would requeue the job and exit rank 0 mid-step, without a checkpoint)."""
    env = os.environ if env is None else env
    names = [f"SIG{preempt_signal}"] if preempt_signal else []
    if env.get("SUBMITIT_EXECUTOR") == "slurm":
        names.append(f"SIG{env.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}")
    return names


def watched_signals(preempt_signal, env=None):
    """The signals a run stops early on: those of requeue_signal_names and, inside a Slurm job,
    SIGTERM."""
    env = os.environ if env is None else env
    names = requeue_signal_names(preempt_signal, env)
    if "SLURM_JOB_ID" in env:
        names.append("SIGTERM")
    return sorted({getattr(signal, name) for name in names})


def post_notice(run_dir, signal_name):
    """`hvdtrain`'s word to rank 0 that it received `signal_name`; the first notice stands (the
    SIGTERM of a requeue that follows a USR1 is not news)."""
    try:
        with open(Path(run_dir) / NOTICE_FILE, "x") as file:
            file.write(signal_name + "\n")
    except FileExistsError:
        pass


def posted_notice(run_dir):
    """The notice `hvdtrain` posted for this run, or None."""
    path = Path(run_dir) / NOTICE_FILE
    try:
        name = path.read_text().strip()
        received_at = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return Notice(name, received_at)


def clear_notice(run_dir):
    """Before a launch: a notice that the last session acted on is not one for the next."""
    (Path(run_dir) / NOTICE_FILE).unlink(missing_ok=True)
