"""hvdtrain on a real Slurm cluster (the `slurm` fixture of conftest.py: 2 nodes of 1 task each),
the ways a Slurm user runs it: a batch script whose body is `hvdtrain` (an array job's too),
`salloc` + `hvdtrain`, `srun hvdtrain` (every task a rank), `launcher=slurm` from the login node,
a sweep through Hydra's submitit launcher, and a job preempted by `scontrol requeue` and then by
the signal ahead of its time limit that is requeued each time, resumes, and ends with the
weights of an uninterrupted run."""

import io
import json
import os
import re
import sys

import pytest
from omegaconf import OmegaConf

from support.commands import wait_until

HVDTRAIN = os.path.join(os.path.dirname(sys.executable), "hvdtrain")
# The digits recipe on 2 nodes; a checkpoint at every logged step (every 5), for the preemptions
RUN = ("recipe=digits", "cluster=2x1", "train.checkpoint_every_s=0.000001", "train.keep_checkpoints=1000")
JOB_TIMEOUT_S = 240


def batch_script(*overrides, sbatch=()):
    lines = ["#!/bin/bash", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
             *(f"#SBATCH {option}" for option in sbatch), f"exec {HVDTRAIN} {' '.join((*RUN, *overrides))}"]
    return "\n".join(lines) + "\n"


def finished(slurm, job, timeout=JOB_TIMEOUT_S):
    fields = slurm.wait_for_job_state(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=timeout)
    assert fields["JobState"] == "COMPLETED", slurm.output(job)
    return fields


def run_dirs(slurm, recipe="digits"):
    return sorted((slurm.output_dir / "runs" / recipe).iterdir())


@pytest.fixture(scope="module")
def uninterrupted(slurm):
    """The batch job of the digits recipe, run to its end: (job id, its run directory)."""
    job = slurm.submit(batch_script())
    finished(slurm, job)
    return job, slurm.output_dir / "runs" / "digits" / f"slurm-{job}"


def test_a_batch_job_of_hvdtrain_trains_on_the_allocation_into_one_run_directory(slurm, uninterrupted):
    job, run_dir = uninterrupted
    output = slurm.output(job)
    hosts = ", ".join(f"{name}:1" for name in slurm.node_names)
    assert f"  cluster      2x1: 2 ranks on {hosts}" in output
    assert f"  run dir      {run_dir}" in output
    assert "target 95: reached" in output
    assert json.loads((run_dir / "results.json").read_text())["epochs_completed"] == 12
    assert run_dirs(slurm) == [run_dir]  # the job's, named by it, and no other


def checkpoint_steps(run_dir):
    return sorted(int(path.stem[5:]) for path in (run_dir / "checkpoints").glob("step-*.ckpt"))


def wait_for_step(run_dir, step, timeout=120):
    wait_until(lambda: any(s >= step for s in checkpoint_steps(run_dir) if (run_dir / "checkpoints").is_dir()),
               timeout, f"a checkpoint of step {step} or later in {run_dir}")


def model_state(run_dir):
    """(step, model weights) of a run's newest checkpoint."""
    import torch

    from hvdtrain.training import checkpoint

    newest = sorted((run_dir / "checkpoints").glob("step-*.ckpt"))[-1]
    state = checkpoint.read(newest, lambda data: torch.load(io.BytesIO(data), weights_only=True))
    return state["global_step"], state["model"]


# The two ways a Slurm job is preempted, met by one requeueable job in turn: Slurm requeues it on
# `scontrol requeue` itself, while on the signal ahead of the time limit (the batch step's USR1)
# hvdtrain requeues its own job.
NOTICES = {"scontrol requeue": (("scontrol", "requeue"), 30, "SIGTERM"),
           "USR1 ahead of the time limit": (("scancel", "--batch", "--signal=USR1"), 100, "SIGUSR1")}


@pytest.fixture(scope="module")
def preempted(slurm):
    """A batch job of the digits recipe preempted by `scontrol requeue` once it has checkpointed
    step 30, and, started again, by USR1 once it has checkpointed step 100, then run to its end:
    (job id, its fields at the end, its output, its run directory)."""
    job = slurm.submit(batch_script(sbatch=("--requeue", "--open-mode=append")))
    run_dir = slurm.output_dir / "runs" / "digits" / f"slurm-{job}"
    slurm.wait_for_job_state(job, "RUNNING", timeout=60)
    for preempt, step, _ in NOTICES.values():
        wait_for_step(run_dir, step)
        slurm.run(*preempt, job)
    return job, finished(slurm, job), slurm.output(job), run_dir


@pytest.fixture(params=list(NOTICES))
def notice(request, preempted):
    """(which preemption of the job, in order, its NOTICES entry, the job as `preempted` gives it)."""
    return list(NOTICES).index(request.param), NOTICES[request.param], preempted


def test_a_preempted_job_stops_with_a_checkpoint_after_the_notice(notice):
    which, (_, step, signal_name), (_, _, output, run_dir) = notice
    said = re.findall(r"hvdtrain: preempted \((\w+)\): stopped after step \d+ with a checkpoint", output)
    stops = [record for record in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if record["event"] == "preempted"]
    assert (said[which], stops[which]["step"] >= step) == (signal_name, True), output


def test_a_preempted_job_is_started_again_by_slurm_and_resumes(notice):
    which, _, (job, fields, output, run_dir) = notice
    assert fields["Restarts"] == "2"
    assert f"hvdtrain: Slurm job {job} started again (SLURM_RESTART_COUNT={which + 1}): resuming {run_dir}" in output


def test_hvdtrain_requeues_its_job_on_the_signal_and_slurm_on_scontrol_requeue(preempted):
    _, _, output, _ = preempted
    assert output.count("hvdtrain: requeued Slurm job") == 1, output
    assert output.index("hvdtrain: requeued Slurm job") > output.index("(SLURM_RESTART_COUNT=1)")


def test_a_twice_preempted_job_ends_with_the_uninterrupted_weights(preempted, uninterrupted):
    import torch

    (step, weights), (expected_step, expected) = model_state(preempted[3]), model_state(uninterrupted[1])
    assert step == expected_step == 12 * 22
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[name], expected[name]) for name in expected)


def test_salloc_then_hvdtrain_and_srun_hvdtrain_train_into_one_directory_each(slurm):
    """`salloc ... hvdtrain` starts the ranks inside the allocation with mpirun, or with srun
    (cluster.launcher=srun); `srun hvdtrain` makes every task a rank, and all of them agree on
    rank 0's run directory (the job's)."""
    salloc = ("salloc", "--nodes=2", "--ntasks-per-node=1")
    for command in ((*salloc, HVDTRAIN), (*salloc, HVDTRAIN, "cluster.launcher=srun"),
                    (*salloc, "srun", "--mpi=pmix", HVDTRAIN)):
        result = slurm.run(*command, *RUN, "train.epochs=1", timeout=JOB_TIMEOUT_S, cwd=slurm.output_dir)
        job = re.search(r"salloc: Granted job allocation (\d+)", result.stdout)[1]
        run_dir = slurm.output_dir / "runs" / "digits" / f"slurm-{job}"
        assert json.loads((run_dir / "results.json").read_text())["epochs_completed"] == 1, result.stdout
        assert result.stdout.count("  run dir      ") == 1, result.stdout  # rank 0 alone says it
        assert not [d for d in run_dirs(slurm) if not (d / "config.yaml").exists()]  # no rank made one of its own


def test_a_layout_larger_than_the_allocation_is_refused_with_both_numbers(slurm):
    result = slurm.run("salloc", "--nodes=2", "--ntasks-per-node=1", HVDTRAIN, "recipe=digits", "cluster=3x1",
                       timeout=60, check=False, cwd=slurm.output_dir)
    assert result.returncode == 2, result.stdout
    nodelist = re.search(r"the Slurm allocation (\S+) gives 2", result.stdout)
    assert nodelist, result.stdout
    assert "hvdtrain: invalid config: cluster=3x1 needs 3 hosts but the Slurm allocation" in result.stdout


def test_launcher_slurm_writes_the_batch_script_into_the_run_directory_and_submits_it(slurm):
    result = slurm.run(HVDTRAIN, *RUN, "train.epochs=1", "launcher=slurm", "hydra.run.dir=runs/submitted",
                       timeout=60, cwd=slurm.output_dir)
    job = re.search(r"hvdtrain: submitted Slurm job (\d+): 2 workers on 2 nodes; run directory", result.stdout)[1]
    run_dir = slurm.output_dir / "runs" / "submitted"
    assert "#SBATCH --signal=B:USR1@120" in (run_dir / "job.sbatch").read_text()
    finished(slurm, job)
    assert "target 95" in (run_dir / f"slurm-{job}.out").read_text()
    assert json.loads((run_dir / "results.json").read_text())["epochs_completed"] == 1


def test_a_sweep_through_the_submitit_launcher_is_one_slurm_job_per_run(slurm):
    result = slurm.run(HVDTRAIN, "-m", "hydra/launcher=submitit_slurm", *RUN, "train.epochs=1", "train.seed=1,2",
                       "hydra.sweep.dir=runs/sweep", timeout=JOB_TIMEOUT_S, cwd=slurm.output_dir)
    sweep = slurm.output_dir / "runs" / "sweep"
    for job in ("0", "1"):
        results = json.loads((sweep / job / "results.json").read_text())
        assert results["epochs_completed"] == 1, result.stdout
    assert [OmegaConf.load(sweep / job / "config.yaml").train.seed for job in ("0", "1")] == [1, 2]


def test_each_task_of_an_array_job_trains_into_a_directory_named_by_it(slurm):
    job = slurm.submit("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --array=0-1\n"
                       f"exec {HVDTRAIN} recipe=digits cluster=1x1 train.epochs=1 train.seed=$SLURM_ARRAY_TASK_ID\n")
    run_dirs_of_tasks = [slurm.output_dir / "runs" / "digits" / f"slurm-{job}_{task}" for task in (0, 1)]
    wait_until(lambda: all((run_dir / "results.json").exists() for run_dir in run_dirs_of_tasks), JOB_TIMEOUT_S,
               f"both tasks of array job {job} to write their results")
    assert [OmegaConf.load(run_dir / "config.yaml").train.seed for run_dir in run_dirs_of_tasks] == [0, 1]
