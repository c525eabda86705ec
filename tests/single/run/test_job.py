"""Which kind of process this is (hvdtrain/run/job.py): a rank of an existing MPI or srun job, or
not; whether `hvdtrain` supervises the job."""

import pytest

from hvdtrain.run import job


@pytest.mark.parametrize("env,inside", [
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"}, True),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, True),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8"}, True),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}, False),
    ({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}, False),  # a batch script
    ({}, False),
], ids=["mpirun", "pmi", "srun step of 8 tasks", "srun step of 1 task", "batch script", "none"])
def test_an_existing_job_is_recognised(env, inside):
    assert job.inside_existing_job(env) is inside


@pytest.mark.parametrize("env,supervised", [
    ({}, True),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, False),  # the user's own mpirun
    ({"OMPI_COMM_WORLD_SIZE": "2", job.SUPERVISED: "1"}, True),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"}, False),
], ids=["the command", "the users mpirun", "a job hvdtrain launched", "an srun step"])
def test_only_jobs_hvdtrain_launched_are_supervised(env, supervised):
    assert job.supervised(env) is supervised
