"""A run asked to stop early by its scheduler: finish the step, checkpoint, stop.

Slurm gives notice before it ends a job: SIGTERM, with `KillWait` seconds (30 by default) before
SIGKILL, when it preempts, requeues or cancels it or its time is up; and, where a batch script
asks for it (`#SBATCH --signal=USR1@120`), a signal of the user's choice that long before the
time limit. Every rank watches for `train.preempt_signal`, and for SIGTERM inside a Slurm job
(elsewhere SIGTERM is how mpirun stops its ranks); the `hvdtrain` command that launched the job
passes a signal it receives itself on to rank 0 through the run directory's notice file.

A notice is a rank's own: the ranks agree on it in the allreduce that every logged step makes
anyway (progress.py), so all of them stop after the same step, at most `train.log_every_steps`
steps after the notice, and rank 0 checkpoints there. Where the notice was the preempt signal
and the job may be requeued, rank 0 requeues its Slurm job, which then resumes from that
checkpoint (runner/slurm.py); a SIGTERM comes from Slurm itself, which requeues the job or not as
its own reason for the SIGTERM says.
"""

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

NOTICE_FILE = ".preempt"  # in the run directory: the signal `hvdtrain` received, for rank 0


@dataclass(frozen=True)
class Notice:
    signal_name: str  # "SIGUSR1"
    received_at: float  # time.time()


class Preempted(Exception):
    """Every rank stops here, after the step the ranks agreed on and its checkpoint."""


_received: Optional[Notice] = None


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
    """The signals a rank stops early on: those of requeue_signal_names and, inside a Slurm job,
    SIGTERM."""
    env = os.environ if env is None else env
    names = requeue_signal_names(preempt_signal, env)
    if "SLURM_JOB_ID" in env:
        names.append("SIGTERM")
    return sorted({getattr(signal, name) for name in names})


def watch(preempt_signal):
    """From now on, the first of the watched signals is this rank's notice (see `notice`)."""
    watched = watched_signals(preempt_signal)
    for signum in watched:
        signal.signal(signum, _take_notice)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)  # hvdtrain starts mpirun with SIGTERM blocked in Slurm


def _take_notice(signum, frame):
    global _received
    if _received is None:
        _received = Notice(signal.Signals(signum).name, time.time())


def notice(run_dir=None):
    """This rank's notice: a watched signal it received, or, given the run directory (rank 0),
    the one that `hvdtrain` received and wrote into its notice file; None when there is none."""
    if _received is not None or run_dir is None:
        return _received
    path = Path(run_dir) / NOTICE_FILE
    try:
        name = path.read_text().strip()
        received_at = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return Notice(name, received_at)


def post_notice(run_dir, signal_name):
    """`hvdtrain`'s word to rank 0 that it received `signal_name`; the first notice stands (the
    SIGTERM of a requeue that follows a USR1 is not news)."""
    try:
        with open(Path(run_dir) / NOTICE_FILE, "x") as file:
            file.write(signal_name + "\n")
    except FileExistsError:
        pass


def clear_notice(run_dir):
    """Before a launch: a notice that the last session acted on is not one for the next."""
    (Path(run_dir) / NOTICE_FILE).unlink(missing_ok=True)
