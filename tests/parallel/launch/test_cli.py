"""The `hvdtrain` command as a user's shell starts it (hvdtrain/launch/cli.py): with no arguments
it trains the default digits recipe on 2 local ranks to its target, leaves every file of a run
directory, logs lines rather than a progress bar into a file, and reports throughput figures that
divide as their names say; a run asked for a progress bar draws one and writes no lines; a
refused command line ends with exit status 2, one line on stderr and nothing on stdout, and
leaves no run directory: here the refusal of train.device=cuda on a machine whose framework sees
no CUDA device with CUDA_VISIBLE_DEVICES='', which only a fresh process can show (a framework
counts its devices once); the plan of that command needs no device and says what launching it
here would meet. Everything else the command decides before launch:
tests/single/launch/test_cli.py."""

import json
import re

import pytest

from hvdtrain.reporting.report import throughput
from hvdtrain.reporting.run_log import read_history

from support.commands import assert_the_figures_divide, results_of, run_hvdtrain

NO_DEVICE = {"CUDA_VISIBLE_DEVICES": ""}


def test_the_default_recipe_trains_digits_with_torch_on_two_local_ranks(default_run):
    results = results_of(default_run[0])
    assert results["recipe"] == "digits" and results["framework"] == "torch"
    assert (results["world_size"], results["global_batch_size"], results["epochs_completed"]) == (2, 64, 12)


def test_the_default_recipe_reaches_its_target(default_run):
    results = results_of(default_run[0])
    assert results["metrics"]["val_top1"] >= 95.0 and results["target_reached"] is True
    assert results["target"]["value"] == 95.0 and results["samples_per_s"] > 0 and results["wall_time_s"] > 0


def test_the_command_says_how_long_the_user_waited_and_results_json_keeps_it(default_run):
    """The ranks' wall time leaves out starting them and writing the report; the command's does not."""
    run_dir, result = default_run
    results = results_of(run_dir)
    said = [line for line in result.stdout.splitlines() if line.startswith("hvdtrain: this run took ")]
    assert said == [f"hvdtrain: this run took {results['command_time_s']:.1f} s from the command (set-up, restarts "
                    "and the report included)"]
    assert results["command_time_s"] > results["wall_time_s"]


def test_the_validation_accuracy_counts_every_image_once(default_run):
    # 360 validation images: the reduced accuracy is a whole number of them
    assert round(results_of(default_run[0])["metrics"]["val_top1"] * 360 / 100, 6).is_integer()


@pytest.mark.parametrize("name", ["config.yaml", "metrics.jsonl", "report.md", "loss.png", "accuracy.png", "lr.png"])
def test_a_run_leaves_its_files(default_run, name):
    assert (default_run[0] / name).is_file()


def test_a_run_leaves_tensorboard_events(default_run):
    assert list((default_run[0] / "tensorboard").glob("events.out.tfevents.*"))


def test_the_summary_names_the_report(default_run):
    run_dir, result = default_run
    assert f"report       {run_dir / 'report.md'}" in result.stdout


def test_the_report_shows_the_accuracy_plot(default_run):
    assert "![accuracy](accuracy.png)" in (default_run[0] / "report.md").read_text()


def test_every_record_has_the_step_epoch_lr_and_loss(default_run):
    assert all({"step", "epoch", "lr", "loss"} <= set(r) for r in read_history(default_run[0] / "metrics.jsonl"))


def test_the_run_evaluates_at_every_epochs_end(default_run):
    records = read_history(default_run[0] / "metrics.jsonl")
    assert [r["epoch"] for r in records if r["event"] == "eval"] == list(range(1, 13))


def test_the_run_keeps_its_last_checkpoints(default_run):
    assert len(list((default_run[0] / "checkpoints").glob("step-*.ckpt"))) == 3  # keep_checkpoints


def test_a_run_logging_to_a_file_draws_no_progress_bar(default_run):
    _, result = default_run  # stderr is a pipe, as in a batch job's log file
    assert "step/s" not in result.stderr and "%|" not in result.stderr  # no trace of tqdm's bar


def test_a_run_logging_to_a_file_writes_a_line_every_logged_step_and_epoch_end(default_run):
    _, result = default_run
    train_lines = re.findall(r"^step (\d+)  epoch \S+  lr \S+  loss \S+  \d+ samples/s \(\d+ per worker\)$",
                             result.stderr, re.MULTILINE)
    # every train.log_every_steps (5) steps, and at each epoch's end (22 steps an epoch)
    expected = sorted({s for s in range(5, 265, 5)} | {22 * e for e in range(1, 13)})
    assert [int(step) for step in train_lines] == expected


def test_a_run_logging_to_a_file_writes_a_line_every_evaluation(default_run):
    _, result = default_run
    assert len(re.findall(r"^step \d+  epoch \d+  lr .* val_top1 ", result.stderr, re.MULTILINE)) == 12


def test_the_results_count_every_epoch(default_run):
    results = results_of(default_run[0])
    assert (results["epochs_completed"], results["epochs"]) == (12, 12)


def test_the_throughput_figures_divide(default_run):
    assert_the_figures_divide(results_of(default_run[0]), samples_trained=264 * 64)  # 12 epochs x 22 steps x 64


def test_the_summary_prints_the_throughput_figures(default_run):
    run_dir, result = default_run
    summary = f"hvdtrain: digits finished 12 of 12 epochs on 2 ranks: {throughput(results_of(run_dir))}"
    assert summary in result.stdout and "16896 samples in " in summary


def test_the_report_prints_the_throughput_figures(default_run):
    run_dir, _ = default_run
    assert f"| trained | {throughput(results_of(run_dir))} |" in (run_dir / "report.md").read_text()


def test_a_run_asked_for_a_progress_bar_draws_one(constant_run):
    _, _, result = constant_run  # HVDTRAIN_PROGRESS_BAR=1, 3 epochs of 22 steps
    assert "100%|" in result.stderr and "66/66" in result.stderr and "step/s" in result.stderr


def test_a_run_drawing_a_progress_bar_writes_no_step_lines(constant_run):
    _, _, result = constant_run
    assert not re.search(r"^step \d+  epoch \S+  lr \S+  loss \S+  \d+ samples/s", result.stderr, re.MULTILINE)


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def cuda_refused(request, tmp_path_factory):
    """(framework, what `hvdtrain train.device=cuda recipe.framework=FRAMEWORK` gave with no
    visible device, the run directory it was given)."""
    run_dir = tmp_path_factory.mktemp("refused") / "run"
    result = run_hvdtrain("train.device=cuda", f"recipe.framework={request.param}", f"hydra.run.dir={run_dir}",
                          env=NO_DEVICE)
    return request.param, result, run_dir


def test_a_refusal_exits_with_status_2_and_prints_nothing_on_stdout(cuda_refused):
    _, result, _ = cuda_refused
    assert (result.returncode, result.stdout) == (2, "")


def test_cuda_without_a_visible_device_is_refused_in_one_line_on_stderr(cuda_refused):
    framework, result, _ = cuda_refused
    assert result.stderr == (
        f"hvdtrain: invalid config: train.device='cuda': no CUDA device visible to {framework} on this machine with "
        f"CUDA_VISIBLE_DEVICES=''; use train.device=auto (a GPU where there is one) or train.device=cpu\n")


def test_a_refusal_leaves_no_run_directory(cuda_refused):
    _, _, run_dir = cuda_refused
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def planned_without_a_device(tmp_path_factory):
    """The plan `hvdtrain train.device=cuda dry_run=true` prints with no visible device."""
    result = run_hvdtrain("train.device=cuda", "dry_run=true", cwd=tmp_path_factory.mktemp("plan"), env=NO_DEVICE)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_plan_of_cuda_needs_no_device(planned_without_a_device):
    assert (planned_without_a_device["device"], planned_without_a_device["gpus_per_host"]) == ("cuda", 2)


def test_the_plan_says_what_launching_it_here_would_meet(planned_without_a_device):
    assert planned_without_a_device["device_reason"].startswith(
        "launching it here is refused: train.device='cuda': no CUDA device")
