"""What hvdtrain does as a Slurm job that needs no Slurm to check: a run directory named by the
job, a requeued job resuming its own run, the requeue after a preempt notice, and the batch
script of launcher=slurm. tests/cluster/test_slurm.py runs all of it on a real Slurm cluster."""

import os
import signal
import stat
import sys

from hvdtrain.launch import slurm
from hvdtrain.run import preemption
from hvdtrain.training import fault_tolerance
from support.commands import run_hvdtrain

DIGITS = ("recipe=digits", "train.epochs=1")


def test_a_run_inside_a_slurm_job_is_named_by_the_job_and_its_requeue_resumes_it(tmp_path):
    job = {"SLURM_JOB_ID": "4711", "SLURM_RESTART_COUNT": "0"}
    first = run_hvdtrain(*DIGITS, cwd=tmp_path, env=job)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "runs" / "digits" / "slurm-4711"
    assert (run_dir / "results.json").is_file()
    assert [path.name for path in (tmp_path / "runs" / "digits").iterdir()] == ["slurm-4711"]

    again = run_hvdtrain(*DIGITS, cwd=tmp_path, env={**job, "SLURM_RESTART_COUNT": "1"})
    assert again.returncode == 0, again.stderr
    assert again.stdout == (f"hvdtrain: Slurm job 4711 started again (SLURM_RESTART_COUNT=1): resuming {run_dir}\n"
                            f"hvdtrain: {run_dir} finished all 1 epochs; nothing to resume "
                            f"(extend it with resume={run_dir} train.epochs=M)\n")

    other = run_hvdtrain(*DIGITS, "optimizer.base_lr=0.2", cwd=tmp_path, env={**job, "SLURM_RESTART_COUNT": "1"})
    assert (other.returncode, other.stderr) == (2, (
        f"hvdtrain: Slurm job 4711 was started again, but its run {run_dir} was started with another config than "
        f"this command composes; continue it with resume={run_dir}, or give another hydra.run.dir\n"))

    array_task = {"SLURM_JOB_ID": "4800", "SLURM_ARRAY_JOB_ID": "4790", "SLURM_ARRAY_TASK_ID": "3"}
    assert slurm.job_run_name(array_task) == "slurm-4790_3"
    assert slurm.job_run_name({}) is None and not slurm.requeued({"SLURM_RESTART_COUNT": "1"})


def fake_scontrol(tmp_path, status):
    """An `scontrol` first on PATH that records its arguments and exits with `status`."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\necho 'Job is not requeueable' >&2\n"
                      f"exit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{folder}:{os.environ['PATH']}", "SLURM_JOB_ID": "4711"}


def test_rank_0_requeues_its_job_with_scontrol_and_says_so(tmp_path, monkeypatch, capsys):
    for name, value in fake_scontrol(tmp_path, 0).items():
        monkeypatch.setenv(name, value)
    fault_tolerance.requeue_job()
    assert (tmp_path / "calls").read_text() == "requeue 4711\n"
    assert capsys.readouterr().out == "hvdtrain: requeued Slurm job 4711; it resumes from this checkpoint\n"

    monkeypatch.setenv("PATH", fake_scontrol(tmp_path, 1)["PATH"])
    fault_tolerance.requeue_job()
    assert capsys.readouterr().err == ("hvdtrain: could not requeue Slurm job 4711 (scontrol requeue: Job is not "
                                       "requeueable); continue it with a job that runs `hvdtrain resume=RUN_DIR`\n")


def test_the_signals_that_stop_a_run_and_those_that_also_requeue_it():
    assert preemption.requeue_signal_names("USR1", {}) == ["SIGUSR1"]
    assert preemption.requeue_signal_names(None, {}) == []
    # Hydra's submitit launcher asks Slurm for its own signal ahead of the time limit
    submitit = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "7"}
    assert preemption.requeue_signal_names("USR1", submitit) == ["SIGUSR1", "SIGUSR2"]
    assert preemption.watched_signals("USR1", {}) == [signal.SIGUSR1]  # SIGTERM is how mpirun stops its ranks
    assert preemption.watched_signals("USR1", submitit) == [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM]


def test_launcher_slurm_dry_run_prints_the_batch_script(tmp_path):
    result = run_hvdtrain("recipe=digits", "cluster=2x4", "launcher=slurm", "slurm.partition=gpu", "slurm.time=02:00:00",
                          "slurm.account=proj7", "slurm.gpus_per_node=4", "slurm.sbatch_lines=['--qos=high']",
                          "hydra.run.dir=runs/one", "dry_run=true", cwd=tmp_path)
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


def test_launcher_slurm_without_sbatch_says_so_in_one_line(tmp_path):
    result = run_hvdtrain("recipe=digits", "launcher=slurm", "hydra.run.dir=runs/one", cwd=tmp_path,
                          env={"PATH": os.path.dirname(sys.executable)})
    assert (result.returncode, result.stderr) == (2, "hvdtrain: launcher=slurm: sbatch was not found on PATH; run on a "
                                                     "Slurm login node, or print the batch script with dry_run=true\n")


def test_srun_as_the_rank_launcher_outside_slurm_says_so_in_one_line(tmp_path):
    result = run_hvdtrain("recipe=digits", "cluster.launcher=srun", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, "hvdtrain: cluster.launcher=srun starts the ranks as a step of a "
                                                     "Slurm job: run inside an allocation (salloc, sbatch, "
                                                     "launcher=slurm), or use cluster.launcher=mpirun\n")
    assert not (tmp_path / "runs").exists()
