"""What a rank does so that its run outlives the job it runs in.

- Checkpoints by time: besides `train.checkpoint_every_steps` and the epochs' ends, a checkpoint
  is due at the first logged step `train.checkpoint_every_s` after the last one (rank 0's clock
  decides), so that a restart (hvdtrain/launch/supervisor.py) loses at most about that much.
- A scheduler's notice (hvdtrain/run/preemption.py: `train.preempt_signal`, and SIGTERM inside a
  Slurm job): a notice is a rank's own (with scancel --signal, Slurm signals the ranks of a job
  step and not the others), or rank 0's through the notice file of the `hvdtrain` command.
- The ranks agree on both in the allreduce that every logged step makes anyway
  (hvdtrain/training/loop.py), so all of them checkpoint after the same step and all stop after
  the same step, at most `train.log_every_steps` steps after the notice; rank 0 checkpoints there.
  Where some rank's notice was a requeue signal and the job may be requeued, rank 0 requeues its
  Slurm job, which then resumes from that checkpoint; a SIGTERM comes from Slurm itself, which
  requeues the job or not as its own reason for the SIGTERM says.
- A rank that fails exits at once with a status that tells the supervisor whether a restart can
  help (hvdtrain/core/exits.py; hvdtrain/training/worker.py).
"""

import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple, Optional

from hvdtrain.run.preemption import Notice, posted_notice, requeue_signal_names, watched_signals

SCONTROL_TIMEOUT_S = 30.0

_received: Optional[Notice] = None


class Preempted(Exception):
    """Every rank stops here, after the step the ranks agreed on and its checkpoint."""


class Decision(NamedTuple):
    """What the ranks agreed on at a logged step."""
    checkpoint: bool  # due by time
    stop: bool  # preempted: checkpoint and stop
    requeue: bool  # ... and requeue the Slurm job: some rank's notice was a requeue signal


CARRY_ON = Decision(checkpoint=False, stop=False, requeue=False)  # between logged steps, nothing is decided


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
    the one that `hvdtrain` received and posted; None when there is none."""
    if _received is not None or run_dir is None:
        return _received
    return posted_notice(run_dir)


class Safeguards:
    """One rank's view of what the run's safety asks at a logged step, and the decision the
    ranks reach from all their views."""

    def __init__(self, train_cfg, run_dir, reads_run_dir):
        """`reads_run_dir`: this rank (rank 0) keeps the clock of checkpoints by time and reads the
        notices that `hvdtrain` posts in `run_dir`."""
        self.every_s, self.preempt_signal = train_cfg.checkpoint_every_s, train_cfg.preempt_signal
        self.run_dir = run_dir if reads_run_dir else None
        self.last_checkpoint = time.time()

    def votes(self):
        """[checkpoint due by time, a notice, a notice that asks for a requeue], as 0 or 1."""
        due = bool(self.run_dir and self.every_s and time.time() - self.last_checkpoint >= self.every_s)
        seen = notice(self.run_dir)
        requeue = bool(seen and seen.signal_name in requeue_signal_names(self.preempt_signal))
        return [float(due), float(seen is not None), float(requeue)]

    @staticmethod
    def decide(averaged_votes):
        """The decision from the votes averaged over the ranks: any rank's vote carries it."""
        return Decision(*(bool(vote > 0) for vote in averaged_votes))

    def checkpointed(self):
        self.last_checkpoint = time.time()


def requeue_job(env=None):
    """Rank 0, after the checkpoint of a run preempted by a requeue signal: requeue this Slurm
    job, which then resumes the run. Says what it did in one line; a failed requeue leaves the run
    to `hvdtrain resume=RUN_DIR`."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if job is None:
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                                timeout=SCONTROL_TIMEOUT_S)
        problem = result.stderr.strip() if result.returncode else None
    except (OSError, subprocess.TimeoutExpired) as error:
        problem = f"{type(error).__name__}: {error}"
    if problem:
        print(f"hvdtrain: could not requeue Slurm job {job} (scontrol requeue: {problem}); "
              f"continue it with a job that runs `hvdtrain resume=RUN_DIR`", file=sys.stderr, flush=True)
    else:
        print(f"hvdtrain: requeued Slurm job {job}; it resumes from this checkpoint", flush=True)
