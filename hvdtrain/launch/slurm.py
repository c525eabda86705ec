"""hvdtrain as a Slurm job: its run directory, the ranks as a job step, and the batch job that
`launcher=slurm` submits. (Rank 0 requeues a preempted job itself: training/fault_tolerance.py.)

Inside a Slurm job a new run's directory is named by the job (runs/RECIPE/slurm-JOBID, or
slurm-ARRAYJOBID_TASKID for an array task) rather than by the time, so that the same job, started
again by a requeue (SLURM_RESTART_COUNT > 0), finds its run there and resumes it (resume.py).

A sweep through Hydra's submitit launcher (`hvdtrain -m hydra/launcher=submitit_slurm ...`) makes
each run a Slurm job of the layout's nodes with one task per rank, every task running the run's
hvdtrain, which then trains as a rank of an srun job (training/worker.py): `submitit_defaults`.

`launcher=slurm` composes and checks the config here, on the login node, makes the run directory
with the resolved config.yaml in it, and submits a batch script, also kept there, whose body is
`hvdtrain resume=RUN_DIR`: the job, and every requeue of it, trains exactly that config.
"""

import os
import shlex
import subprocess
from pathlib import Path

from hvdtrain.run.config import ConfigError

SBATCH_TIMEOUT_S = 30.0
BATCH_SCRIPT = "job.sbatch"


def job_run_name(env=None):
    """The name of a new run's directory inside a Slurm job, or None outside one."""
    env = os.environ if env is None else env
    if "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env:
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if "SLURM_JOB_ID" in env:
        return f"slurm-{env['SLURM_JOB_ID']}"
    return None


def requeued(env=None):
    """Whether this Slurm job has been started before (a requeue, or a restart after a node failed)."""
    env = os.environ if env is None else env
    return job_run_name(env) is not None and int(env.get("SLURM_RESTART_COUNT") or 0) > 0


def srun_command(program, hosts):
    """The srun argv that starts `program` as one task per rank on `hosts` (within the allocation
    this runs in), each rank's MPI wired up by Slurm's PMIx."""
    ranks = sum(host.slots for host in hosts)
    return ["srun", f"--nodes={len(hosts)}", f"--ntasks={ranks}", f"--ntasks-per-node={hosts[0].slots}",
            f"--nodelist={','.join(host.host for host in hosts)}", "--mpi=pmix", "--kill-on-bad-exit=1",
            "--cpu-bind=none", *program]


def batch_script(cfg, run_dir, command):
    """The batch script of `launcher=slurm`: the layout's nodes and tasks, the `slurm.*` settings,
    output into the run directory, and `command` (the resume of the run) as its body."""
    slurm, run_dir = cfg.slurm, Path(run_dir).resolve()
    options = [f"--job-name=hvdtrain-{cfg.recipe.name}",
               f"--nodes={cfg.cluster.num_hosts}",
               f"--ntasks-per-node={cfg.cluster.slots}",
               f"--output={run_dir}/slurm-%j.out",
               "--open-mode=append"]  # a requeued job adds to the same output file
    if slurm.partition:
        options.append(f"--partition={slurm.partition}")
    if slurm.account:
        options.append(f"--account={slurm.account}")
    if slurm.time:
        options.append(f"--time={slurm.time}")
    if slurm.gpus_per_node:
        options.append(f"--gpus-per-node={slurm.gpus_per_node}")
    if slurm.signal_before_s and cfg.train.preempt_signal:
        # To the batch shell, which is `hvdtrain` (exec): it passes the notice on to rank 0
        options.append(f"--signal=B:{cfg.train.preempt_signal}@{slurm.signal_before_s}")
    options.append("--requeue" if slurm.requeue else "--no-requeue")
    options += list(slurm.sbatch_lines)
    lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in options), "",
             f"cd {shlex.quote(os.getcwd())}", f"exec {shlex.join(command)}", ""]
    return "\n".join(lines)


def submit(cfg, run_dir, command):
    """Write the batch script into the run directory and submit it; returns the job id."""
    script = Path(run_dir) / BATCH_SCRIPT
    script.write_text(batch_script(cfg, run_dir, command))
    try:
        result = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                                timeout=SBATCH_TIMEOUT_S)
    except FileNotFoundError:
        raise ConfigError("launcher=slurm: sbatch was not found on PATH; run on a Slurm login node, or print "
                          "the batch script with dry_run=true") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"launcher=slurm: sbatch gave no answer in {SBATCH_TIMEOUT_S:.0f} s") from None
    if result.returncode:
        raise ConfigError(f"launcher=slurm: sbatch refused {script}: {result.stderr.strip()}")
    return result.stdout.strip().split(";")[0]


SUBMITIT_LAUNCHER = "hydra/launcher=submitit_slurm"


def submitit_defaults(overrides):
    """What hvdtrain adds to a command line that sweeps through Hydra's submitit launcher, where the
    user has not set it: a job of the layout's nodes, a task per rank, the ranks' MPI wired by
    Slurm's PMIx. One sweep is one job array of one shape, so `cluster` cannot be swept there."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    if SUBMITIT_LAUNCHER not in overrides:
        return []
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    for override in parsed:
        if override.key_or_group == "cluster" and override.value_type != ValueType.ELEMENT:
            raise ConfigError(f"{override.input_line}: a sweep through {SUBMITIT_LAUNCHER} submits one Slurm job "
                              f"array, whose jobs all have one shape; sweep over the layout with one command per "
                              f"layout")
    given = {override.key_or_group for override in parsed}
    defaults = {"hydra.launcher.nodes": "${cluster.num_hosts}", "hydra.launcher.tasks_per_node": "${cluster.slots}",
                # srun's options as its environment: the plugin has no setting for srun's arguments
                "hydra.launcher.setup": "['export SLURM_MPI_TYPE=pmix','export SLURM_CPU_BIND=none']"}
    return [f"{key}={value}" for key, value in defaults.items() if key not in given]
