"""Which kind of process this is: a rank of an MPI job already (started by mpirun or srun),
whether `hvdtrain` started that job and so restarts it after a failure, and whether a terminal
shows what rank 0 writes."""

import os
import sys

from hvdtrain.run.config import ConfigError

SUPERVISED = "HVDTRAIN_SUPERVISED"  # set in the environment of the ranks `hvdtrain` launched
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def inside_existing_job(env=None):
    """Whether this process already is a rank of an MPI job (started by mpirun, or by srun with
    several tasks). A single-task srun step (an interactive shell) is not a job to train in:
    from there, hvdtrain launches its own."""
    env = os.environ if env is None else env
    if any(name in env for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK")):
        return True
    if "PMIX_RANK" in env or ("SLURM_STEP_ID" in env and "SLURM_PROCID" in env):
        return int(env.get("SLURM_STEP_NUM_TASKS", "2")) > 1
    return False


def supervised(env=None):
    """Whether this process is `hvdtrain` about to launch a job, or a rank of one it launched:
    a job that mpirun or srun started is theirs to restart, not hvdtrain's."""
    env = os.environ if env is None else env
    return env.get(SUPERVISED) == "1" or not inside_existing_job(env)


def launcher_rank(env=None):
    """This process's rank as its launcher numbered it, read before (or without) the engine: for
    messages that must name the rank whatever state the engine is in."""
    env = os.environ if env is None else env
    return next((env[name] for name in RANK_VARIABLES if name in env), "0")


# mpirun hands the workers' stderr on through a pipe, so a worker cannot tell whether a terminal
# shows it: the `hvdtrain` command, which can, says so in this variable.
PROGRESS_BAR_VARIABLE = "HVDTRAIN_PROGRESS_BAR"


def progress_bar_wanted(environ):
    """Whether rank 0 draws a progress bar (HVDTRAIN_PROGRESS_BAR=1) or writes a line a record
    (0); unset, as in a job started by another launcher, whether stderr is a terminal."""
    setting = environ.get(PROGRESS_BAR_VARIABLE)
    if setting is None:
        return sys.stderr.isatty()
    if setting not in ("0", "1"):
        raise ConfigError(f"environment variable {PROGRESS_BAR_VARIABLE} must be 0 or 1, got {setting!r}")
    return setting == "1"
