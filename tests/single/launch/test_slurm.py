"""hvdtrain and Slurm without a Slurm cluster (hvdtrain/launch/slurm.py): a run inside a Slurm job
is named by the job (or its array task), a job started again is told apart, and launcher=slurm's
batch script, printed by a dry run, or refused where sbatch is not there. Runs inside a Slurm
job: tests/parallel/launch/test_slurm.py; on a real Slurm cluster: tests/cluster/test_slurm.py."""

import os
import sys

from hvdtrain.launch import slurm

from support.commands import hvdtrain_here


def test_a_run_inside_an_array_task_is_named_by_the_array_job_and_task():
    array_task = {"SLURM_JOB_ID": "4800", "SLURM_ARRAY_JOB_ID": "4790", "SLURM_ARRAY_TASK_ID": "3"}
    assert slurm.job_run_name(array_task) == "slurm-4790_3"


def test_outside_a_slurm_job_a_run_has_no_jobs_name():
    assert slurm.job_run_name({}) is None


def test_a_restart_count_outside_a_slurm_job_is_no_requeue():
    assert not slurm.requeued({"SLURM_RESTART_COUNT": "1"})


def test_launcher_slurm_dry_run_prints_the_batch_script(tmp_path, monkeypatch):
    result = hvdtrain_here("recipe=digits", "cluster=2x4", "launcher=slurm", "slurm.partition=gpu",
                           "slurm.time=02:00:00", "slurm.account=proj7", "slurm.gpus_per_node=4",
                           "slurm.sbatch_lines=['--qos=high']", "hydra.run.dir=runs/one", "dry_run=true",
                           monkeypatch=monkeypatch, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "runs" / "one"
    assert result.stdout.splitlines() == [
        "#!/bin/bash",
        "#SBATCH --job-name=hvdtrain-digits",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj7",
        "#SBATCH --time=02:00:00",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --signal=B:USR1@120",
        "#SBATCH --requeue",
        "#SBATCH --qos=high",
        "",
        f"cd {tmp_path}",
        f"exec {os.path.abspath(sys.executable)} -m hvdtrain.launch.cli resume={run_dir}",
    ]
    assert not run_dir.exists()  # a dry run leaves nothing behind


def test_launcher_slurm_without_sbatch_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    result = hvdtrain_here("recipe=digits", "launcher=slurm", "hydra.run.dir=runs/one", monkeypatch=monkeypatch,
                           cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, "hvdtrain: launcher=slurm: sbatch was not found on PATH; run on a "
                                                     "Slurm login node, or print the batch script with dry_run=true\n")
