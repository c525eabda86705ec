"""Every rank's entry point (hvdtrain/training/worker.py) in jobs that mpirun started with
`hvdtrain` inside: rank 0's config is the run's and the run trains in place (an ImageFolder
recipe); a device the command could not check is refused by the ranks in one line; a bad
progress bar setting stops the job cleanly, and so does a Horovod variable the ranks refuse as
they start; a rank's error ends the job with it."""

import json
import re
import sys

import pytest

from hvdtrain.launch import mpirun

from parallel.runs import TIMEOUT


def hvdtrain_in_an_mpirun_job(*args, env=None):
    """`mpirun -np 2 hvdtrain ARGS`, as a user's own mpirun (or a Slurm step) starts it."""
    environment = {**mpirun.worker_environment(2), **(env or {})}
    program = [sys.executable, "-m", "hvdtrain.launch.cli", *args]
    return mpirun.run(mpirun.mpirun_command(program, num_proc=2, env=environment), env=environment, timeout=TIMEOUT,
                      capture=True)


@pytest.fixture(scope="module")
def imagefolder_in_place(tmp_path_factory, image_tree):
    """(run directory, what the job printed) of resnet50_imagenet for one epoch on the tiny tree,
    started by mpirun."""
    run_dir = tmp_path_factory.mktemp("in_place") / "run"
    result = hvdtrain_in_an_mpirun_job("recipe=resnet50_imagenet", f"data.root={image_tree}", "model.num_classes=3",
                                       "data.image_size=32", "data.resize_size=36", "data.loader_workers=1",
                                       "train.batch_size=4", "train.epochs=1", "schedule.warmup_epochs=1",
                                       f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stdout
    return run_dir, result.stdout


def test_a_job_of_two_ranks_trains_an_imagefolder_recipe(imagefolder_in_place):
    run_dir, _ = imagefolder_in_place
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["world_size"], results["global_batch_size"], results["epochs_completed"]) == (2, 8, 1)


def test_every_validation_image_is_counted_once(imagefolder_in_place):
    run_dir, _ = imagefolder_in_place
    results = json.loads((run_dir / "results.json").read_text())
    assert round(results["metrics"]["val_top1"] * 9 / 100, 6).is_integer()  # 9 validation images


def test_a_job_started_by_mpirun_trains_in_place(imagefolder_in_place):
    _, output = imagefolder_in_place
    assert "hvdtrain: starting" not in output  # no second launch


def test_rank_0_alone_reports(imagefolder_in_place):
    _, output = imagefolder_in_place
    assert output.count("hvdtrain: recipe resnet50_imagenet") == 1


def test_rank_0_alone_checkpoints(imagefolder_in_place):
    run_dir, _ = imagefolder_in_place
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000000003.ckpt"]  # 24 // 2 // 4


def test_a_job_started_by_mpirun_logs_lines(imagefolder_in_place):
    # no hvdtrain command to say whether a terminal shows stderr, and mpirun's pipe is none: lines
    _, output = imagefolder_in_place
    assert "step/s" not in output and re.search(r"^step 3  epoch 1  lr ", output, re.MULTILINE)


@pytest.fixture(scope="module")
def cuda_nowhere(tmp_path_factory):
    """(run directory, what the job printed) of train.device=cuda in a job of two ranks that see
    no CUDA device, as on hosts the `hvdtrain` command cannot see."""
    run_dir = tmp_path_factory.mktemp("cuda") / "run"
    result = hvdtrain_in_an_mpirun_job("train.device=cuda", f"hydra.run.dir={run_dir}",
                                       env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode != 0
    return run_dir, result.stdout


def test_a_device_the_command_could_not_check_is_refused_by_rank_0_in_one_line(cuda_nowhere):
    _, output = cuda_nowhere
    line = ("hvdtrain: invalid config: train.device='cuda': no CUDA device visible to torch on this machine with "
            "CUDA_VISIBLE_DEVICES=''; use train.device=auto (a GPU where there is one) or train.device=cpu\n")
    assert output.count("hvdtrain: invalid config") == 1 and line in output


def test_a_device_refused_by_the_ranks_prints_no_traceback(cuda_nowhere):
    _, output = cuda_nowhere
    assert "Traceback" not in output


@pytest.fixture(scope="module")
def bad_progress_bar_setting(tmp_path_factory):
    """(run directory, what the job printed) of a job whose environment has HVDTRAIN_PROGRESS_BAR=maybe."""
    run_dir = tmp_path_factory.mktemp("bar") / "run"
    result = hvdtrain_in_an_mpirun_job(f"hydra.run.dir={run_dir}", env={"HVDTRAIN_PROGRESS_BAR": "maybe"})
    assert result.returncode != 0
    return run_dir, result.stdout


def test_a_bad_progress_bar_setting_in_an_mpirun_job_is_refused_by_name(bad_progress_bar_setting):
    _, output = bad_progress_bar_setting
    # mpirun may stop the second rank before it says the same
    assert "hvdtrain: environment variable HVDTRAIN_PROGRESS_BAR must be 0 or 1, got 'maybe'" in output


def test_a_bad_progress_bar_setting_in_an_mpirun_job_stops_it_cleanly(bad_progress_bar_setting):
    run_dir, output = bad_progress_bar_setting
    assert "Traceback" not in output and not run_dir.exists()


def test_ranks_that_refuse_a_horovod_variable_at_start_exit_as_a_config_error_in_one_line(tmp_path):
    """The launcher checks the variables it passes on, but a rank's own environment (a remote
    host's) may differ: its refusal at start is no failure a restart would mend (exit status 2)."""
    environment = {**mpirun.worker_environment(2), "HOROVOD_FUSION_THRESHOLD": "abc"}
    program = [sys.executable, "-m", "hvdtrain.training.worker", str(tmp_path)]
    result = mpirun.run(mpirun.mpirun_command(program, num_proc=2, env=environment), env=environment, timeout=TIMEOUT,
                        capture=True)
    assert result.returncode == 2, result.stdout
    # mpirun may stop one rank before it says the same
    assert re.search(r"hvdtrain: rank [01]: environment variable HOROVOD_FUSION_THRESHOLD='abc' is not a valid int\n",
                     result.stdout), result.stdout
    assert "Traceback" not in result.stdout


def test_a_failing_rank_says_its_error_in_one_line(failing_run):
    _, result, broken = failing_run
    output = result.stdout + result.stderr
    assert re.search(rf"hvdtrain: rank [01]: {re.escape(str(broken))}: no decoder reads it", output), output
    assert "Traceback" not in output
