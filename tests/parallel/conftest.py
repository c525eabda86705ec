"""Training runs that tests of several modules read, each run once a session (runs.py says what
they are): the default recipe to the end, RUN crashed and resumed, a job that a rank's error
stops, and CONSTANT as a Slurm job."""

import shutil

import pytest

from support.commands import crash_and_resume, run_hvdtrain

from parallel.runs import CONSTANT, RUN, SLURM_JOB, TIMEOUT


@pytest.fixture(scope="session")
def default_run(tmp_path_factory):
    """`hvdtrain` with no arguments (the digits recipe on 2 local ranks), run to the end: (run
    directory, what the command gave). Runs of RUN that were interrupted end as this one."""
    run_dir = tmp_path_factory.mktemp("default") / "run"
    result = run_hvdtrain(f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, result


@pytest.fixture(scope="session")
def crashed_and_resumed(tmp_path_factory):
    """RUN killed as a whole as soon as it has written two checkpoints, its newest checkpoint cut
    short, then resumed with train.device=cpu, the one key besides train.epochs that resume takes
    (a GPU's checkpoint goes on on a CPU; tests/gpu does that), to its end: (run directory, what
    the resume printed). The device stays the CPU of train.device=auto here."""
    run_dir = tmp_path_factory.mktemp("crashed") / "run"
    return run_dir, crash_and_resume(run_dir, *RUN, resume_args=["train.device=cpu"], timeout=TIMEOUT)


@pytest.fixture(scope="session")
def failing_run(tmp_path_factory, image_tree):
    """An ImageFolder recipe whose tree holds a file no decoder reads (data.bad_files=stop, the
    default): the rank that meets it stops the job with an error a restart would meet again.
    (run directory, what the command gave, the unreadable file)."""
    where = tmp_path_factory.mktemp("failing")
    root = where / "images"
    shutil.copytree(image_tree, root)
    broken = root / "train" / "red" / "broken.png"
    broken.write_bytes(b"not an image")
    run_dir = where / "run"
    result = run_hvdtrain("recipe=resnet50_imagenet", "cluster=local", f"data.root={root}", "model.num_classes=3",
                          "data.image_size=32", "data.resize_size=32", "data.loader_workers=1", "train.batch_size=4",
                          f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    return run_dir, result, broken


@pytest.fixture(scope="session")
def constant_run(tmp_path_factory):
    """`hvdtrain CONSTANT`, the digits recipe for 3 epochs at a constant LR with a checkpoint at
    every logged step, run to the end, uninterrupted, as the first start of Slurm job 4711, with a
    progress bar asked for (HVDTRAIN_PROGRESS_BAR=1), in a directory of its own: (that directory,
    the run directory the job named, what the command gave). The Slurm job and the bar change
    nothing of what it trains, which an extended run is compared with."""
    where = tmp_path_factory.mktemp("constant")
    result = run_hvdtrain(*CONSTANT, cwd=where, env={**SLURM_JOB, "HVDTRAIN_PROGRESS_BAR": "1"}, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return where, where / "runs" / "digits" / "slurm-4711", result
