"""`hvdtrain` as a Slurm job without a Slurm cluster (hvdtrain/launch/slurm.py, resume.py): a run
inside a Slurm job is named by the job, and when the same job starts again (SLURM_RESTART_COUNT
> 0) it finds its run there: a finished one is not trained again, and a command line composing
another config is refused. The requeued command runs in this process. On a real Slurm cluster:
tests/cluster/test_slurm.py."""

import pytest

from support.commands import hvdtrain_here

from parallel.runs import CONSTANT, SLURM_JOB


@pytest.fixture
def started_again(constant_run, monkeypatch):
    """requeued(*ARGS): what `hvdtrain ARGS` gives in the directory of constant_run as Slurm job
    4711 started again."""
    where, _, _ = constant_run
    for name, value in {**SLURM_JOB, "SLURM_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(name, value)

    def requeued(*args):
        return hvdtrain_here(*args, monkeypatch=monkeypatch, cwd=where)

    return requeued


def test_a_run_inside_a_slurm_job_is_named_by_the_job(constant_run):
    _, run_dir, _ = constant_run
    assert (run_dir / "results.json").is_file()


def test_a_run_inside_a_slurm_job_makes_no_other_run_directory(constant_run):
    where, _, _ = constant_run
    assert [path.name for path in (where / "runs" / "digits").iterdir()] == ["slurm-4711"]


def test_a_requeued_job_resumes_its_run_which_has_finished(constant_run, started_again):
    _, run_dir, _ = constant_run
    again = started_again(*CONSTANT)
    assert again.returncode == 0, again.stderr
    assert again.stdout == (f"hvdtrain: Slurm job 4711 started again (SLURM_RESTART_COUNT=1): resuming {run_dir}\n"
                            f"hvdtrain: {run_dir} finished all 3 epochs; nothing to resume "
                            f"(extend it with resume={run_dir} train.epochs=M)\n")


def test_a_requeued_job_composing_another_config_is_refused(constant_run, started_again):
    _, run_dir, _ = constant_run
    other = started_again(*CONSTANT, "optimizer.base_lr=0.2")
    assert (other.returncode, other.stderr) == (2, (
        f"hvdtrain: Slurm job 4711 was started again, but its run {run_dir} was started with another config than "
        f"this command composes; continue it with resume={run_dir}, or give another hydra.run.dir\n"))
