"""The top-level `launcher` key and the `slurm` section: whether `hvdtrain` starts the job now,
from here, or submits it to Slurm as a batch job (hvdtrain/launch/slurm.py)."""

import re
from dataclasses import dataclass, field
from typing import List, Optional

# launcher: start the job from here now, submit it to Slurm, or print it for Kubernetes (kubernetes.py)
LAUNCHERS = ("local", "slurm", "kubernetes")


@dataclass
class SlurmConfig:
    """The batch job that `launcher=slurm` writes into the run directory and submits with sbatch."""
    partition: Optional[str] = None
    time: Optional[str] = None  # the job's time limit, as sbatch takes it: "MINUTES", "HH:MM:SS", "D-HH:MM:SS"
    account: Optional[str] = None
    gpus_per_node: int = 0
    # train.preempt_signal is sent this many seconds before the time limit: the run checkpoints,
    # stops, and requeues its job, which resumes it (0: no signal ahead of the limit)
    signal_before_s: int = 120
    requeue: bool = True  # the job may be requeued (preemption, scontrol requeue) and then resumes
    sbatch_lines: List[str] = field(default_factory=list)  # more sbatch options, e.g. ["--qos=high"]


def check(cfg, problems):
    problems.check(cfg.launcher in LAUNCHERS, "launcher", f"allowed: {', '.join(LAUNCHERS)}")
    slurm = cfg.slurm
    problems.check(slurm.gpus_per_node >= 0, "slurm.gpus_per_node", "must be 0 or more")
    problems.check(slurm.signal_before_s >= 0, "slurm.signal_before_s", "must be 0 (no signal) or a number of seconds")
    problems.check(not slurm.time or re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", slurm.time), "slurm.time",
                   "must be a time limit as sbatch takes it: MINUTES, HH:MM:SS or D-HH:MM:SS")
    for line in slurm.sbatch_lines:
        problems.check(line.startswith("-"), "slurm.sbatch_lines",
                       f"{line!r} is not an sbatch option (such as --qos=high)")
