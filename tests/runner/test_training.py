"""Training runs, each with real ranks: the default digits recipe and the figures it reports; a
run killed after a checkpoint and resumed ends exactly as an uninterrupted one; a finished run is
not resumed, and an extended one ends as one started with its new epochs; an ImageFolder recipe
trained inside an existing mpirun job; a failing worker; a sweep; exact validation sums."""

import io
import json
import re
import sys

import pytest

from hvdtrain.launch import mpirun as launcher
from hvdtrain.reporting.report import throughput
from hvdtrain.reporting.run_log import read_history
from support.commands import assert_the_figures_divide, crash_and_resume, history, newest_checkpoint, results_of, run_hvdtrain, start_and_kill

TIMEOUT = 240


def last_checkpoint(run_dir):
    import torch

    return newest_checkpoint(run_dir, lambda data: torch.load(io.BytesIO(data), weights_only=True))


def assert_same_weights(run_dir, expected_dir):
    """The newest checkpoints of two runs hold the same weights and momentum buffers, bit for bit."""
    import torch

    resumed, expected = last_checkpoint(run_dir), last_checkpoint(expected_dir)
    assert resumed["global_step"] == expected["global_step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    for index, state in expected["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"])


def files_of(run_dir):
    return {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`hvdtrain` with no arguments (the digits recipe on 2 local ranks), run to the end."""
    run_dir = tmp_path_factory.mktemp("default") / "run"
    result = run_hvdtrain(f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, result


def test_the_default_recipe_reaches_its_target_on_two_local_ranks(default_run):
    run_dir, result = default_run
    results = json.loads((run_dir / "results.json").read_text())
    assert results["recipe"] == "digits" and results["framework"] == "torch"
    assert (results["world_size"], results["global_batch_size"], results["epochs_completed"]) == (2, 64, 12)
    assert results["metrics"]["val_top1"] >= 95.0 and results["target_reached"] is True
    assert results["target"]["value"] == 95.0 and results["samples_per_s"] > 0 and results["wall_time_s"] > 0
    # 360 validation images: the reduced accuracy is a whole number of them
    assert round(results["metrics"]["val_top1"] * 360 / 100, 6).is_integer()
    assert f"report       {run_dir / 'report.md'}" in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "report.md", "loss.png", "accuracy.png", "lr.png"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "![accuracy](accuracy.png)" in (run_dir / "report.md").read_text()
    records = read_history(run_dir / "metrics.jsonl")
    assert all({"step", "epoch", "lr", "loss"} <= set(r) for r in records)
    assert [r["epoch"] for r in records if r["event"] == "eval"] == list(range(1, 13))
    assert len(list((run_dir / "checkpoints").glob("step-*.ckpt"))) == 3  # keep_checkpoints


def test_a_run_logging_to_a_file_writes_lines_not_a_progress_bar(default_run):
    _, result = default_run  # stderr is a pipe, as in a batch job's log file
    assert "step/s" not in result.stderr and "%|" not in result.stderr  # no trace of tqdm's bar
    train_lines = re.findall(r"^step (\d+)  epoch \S+  lr \S+  loss \S+  \d+ samples/s \(\d+ per worker\)$",
                             result.stderr, re.MULTILINE)
    # every train.log_every_steps (5) steps, and at each epoch's end (22 steps an epoch)
    expected = sorted({s for s in range(5, 265, 5)} | {22 * e for e in range(1, 13)})
    assert [int(step) for step in train_lines] == expected
    assert len(re.findall(r"^step \d+  epoch \d+  lr .* val_top1 ", result.stderr, re.MULTILINE)) == 12


def test_a_run_asked_for_a_progress_bar_draws_one(tmp_path):
    result = run_hvdtrain(f"hydra.run.dir={tmp_path / 'run'}", "train.epochs=1",
                          env={"HVDTRAIN_PROGRESS_BAR": "1"}, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "100%|" in result.stderr and "22/22" in result.stderr and "step/s" in result.stderr
    assert not re.search(r"^step \d+  epoch \S+  lr \S+  loss \S+  \d+ samples/s", result.stderr, re.MULTILINE)


def test_the_throughput_figures_divide_and_the_summary_prints_them_so(default_run):
    run_dir, result = default_run
    results = results_of(run_dir)
    assert (results["epochs_completed"], results["epochs"]) == (12, 12)
    assert_the_figures_divide(results, samples_trained=264 * 64)  # 12 epochs x 22 steps x 64 samples
    summary = f"hvdtrain: digits finished 12 of 12 epochs on 2 ranks: {throughput(results)}"
    assert summary in result.stdout and "16896 samples in " in summary
    assert f"| trained | {throughput(results)} |" in (run_dir / "report.md").read_text()


def test_a_killed_run_resumes_to_the_same_weights(default_run, tmp_path):
    """Resumed with train.device=cpu, the one key besides train.epochs that resume takes (a GPU's
    checkpoint goes on on a CPU; tests/gpu does that): here the device stays the CPU of train.device=auto."""
    uninterrupted, _ = default_run
    run_dir = tmp_path / "run"
    result = crash_and_resume(run_dir, resume_args=["train.device=cpu"], timeout=TIMEOUT)
    assert f"hvdtrain: {run_dir} goes on with train.device=cpu (it was started with train.device=auto)" in result.stdout
    assert "  device       cpu (train.device=cpu)" in result.stdout
    assert "  device: cpu\n" in (run_dir / "config.yaml").read_text()  # where the workers read it

    assert last_checkpoint(run_dir)["global_step"] == 264
    assert_same_weights(run_dir, uninterrupted)
    assert history(run_dir) == history(uninterrupted)
    assert results_of(run_dir)["metrics"] == results_of(uninterrupted)["metrics"]
    assert_the_figures_divide(results_of(run_dir), samples_trained=264 * 64)


def test_resume_refuses_other_overrides(default_run):
    run_dir, _ = default_run
    result = run_hvdtrain(f"resume={run_dir}", "optimizer.base_lr=0.2")
    assert result.returncode != 0 and result.stderr == (
        f"hvdtrain: resume={run_dir} continues that run with its saved config.yaml; it cannot be combined with "
        f"optimizer.base_lr=0.2 (only train.epochs=N, which extends it, and train.device=..., which moves it to "
        f"other hardware)\n")


def test_resuming_a_finished_run_says_so_and_changes_nothing(default_run):
    run_dir, _ = default_run
    before = files_of(run_dir)
    result = run_hvdtrain(f"resume={run_dir}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == (f"hvdtrain: {run_dir} finished all 12 epochs; nothing to resume "
                             f"(extend it with resume={run_dir} train.epochs=M)\n")
    assert files_of(run_dir) == before


def test_extending_a_cosine_run_says_what_becomes_of_its_schedule(default_run):
    run_dir, _ = default_run
    before = files_of(run_dir)
    result = run_hvdtrain(f"resume={run_dir}", "train.epochs=14", "dry_run=true")
    assert result.returncode == 0, result.stdout + result.stderr
    notice, plan = result.stdout.splitlines()
    assert notice == (f"hvdtrain: extending {run_dir} from 12 to 14 epochs; its cosine decay is stretched to end "
                      f"at epoch 14: from epoch 12 on the LR follows the 14-epoch curve, so the result is not that "
                      f"of a run started with train.epochs=14")
    assert json.loads(plan)["epochs"] == 14
    assert files_of(run_dir) == before, "a dry run writes nothing"


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory):
    """A 2-epoch run with a constant LR, killed as soon as its first results.json appears, resumed
    to its end, then extended to 3 epochs: (run dir, the results.json seen when it was killed,
    the extension's output)."""
    run_dir = tmp_path_factory.mktemp("extended") / "run"
    results = run_dir / "results.json"
    early = start_and_kill(run_dir, "schedule=constant", "train.epochs=2",
                           until=lambda: results.exists() and results_of(run_dir), timeout=TIMEOUT)
    for args in ([], ["train.epochs=3"]):
        result = run_hvdtrain(f"resume={run_dir}", *args, timeout=TIMEOUT)
        assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, early, result


@pytest.fixture(scope="module")
def constant_run(tmp_path_factory):
    """The same recipe trained for 3 epochs at once."""
    run_dir = tmp_path_factory.mktemp("constant") / "run"
    result = run_hvdtrain("schedule=constant", "train.epochs=3", f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir


def test_a_run_stopped_early_reports_the_epochs_it_completed(extended_run):
    _, early, _ = extended_run
    assert (early["epochs_completed"], early["epochs"]) == (1, 2)
    assert_the_figures_divide(early, samples_trained=22 * 64)


def test_an_extended_run_ends_as_one_started_with_its_new_epochs(extended_run, constant_run):
    run_dir, _, result = extended_run
    assert (f"hvdtrain: extending {run_dir} from 2 to 3 epochs; its constant schedule does not depend on "
            f"train.epochs: it trains on as a run started with train.epochs=3 would") in result.stdout
    assert "hvdtrain: resuming at epoch 2, step 0" in result.stdout
    assert "train:\n  epochs: 3\n" in (run_dir / "config.yaml").read_text()
    assert_same_weights(run_dir, constant_run)
    assert history(run_dir) == history(constant_run)
    results = results_of(run_dir)
    assert (results["epochs_completed"], results["epochs"]) == (3, 3)
    assert results["metrics"] == results_of(constant_run)["metrics"]
    assert_the_figures_divide(results, samples_trained=3 * 22 * 64)


@pytest.mark.parametrize("epochs", [3, 2])
def test_extending_to_no_more_epochs_than_done_is_refused_with_the_numbers(extended_run, epochs):
    run_dir, _, _ = extended_run
    before = files_of(run_dir)
    result = run_hvdtrain(f"resume={run_dir}", f"train.epochs={epochs}")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"hvdtrain: train.epochs={epochs}: {run_dir} has done 3 of its 3 epochs already; "
                             f"resume={run_dir} train.epochs=N trains on to N epochs, N more than 3\n")
    assert files_of(run_dir) == before


def test_an_imagefolder_recipe_trains_inside_an_existing_mpirun_job(image_tree, tmp_path):
    run_dir = tmp_path / "run"
    environment = launcher.worker_environment(2)
    program = [sys.executable, "-m", "hvdtrain.launch.cli", "recipe=resnet50_imagenet", f"data.root={image_tree}",
               "model.num_classes=3", "data.image_size=32", "data.resize_size=36", "data.loader_workers=1",
               "train.batch_size=4", "train.epochs=1", "schedule.warmup_epochs=1", f"hydra.run.dir={run_dir}"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode == 0, result.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["world_size"], results["global_batch_size"], results["epochs_completed"]) == (2, 8, 1)
    assert round(results["metrics"]["val_top1"] * 9 / 100, 6).is_integer()  # 9 validation images, all counted
    assert "hvdtrain: starting" not in result.stdout  # trained in place, no second launch
    assert result.stdout.count("hvdtrain: recipe resnet50_imagenet") == 1  # rank 0 alone reports
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000000003.ckpt"]  # 24 // 2 // 4
    # no hvdtrain command to say whether a terminal shows stderr, and mpirun's pipe is none: lines
    assert "step/s" not in result.stdout and re.search(r"^step 3  epoch 1  lr ", result.stdout, re.MULTILINE)


def test_a_bad_progress_bar_setting_inside_an_existing_mpirun_job_stops_it_cleanly(tmp_path):
    environment = {**launcher.worker_environment(2), "HVDTRAIN_PROGRESS_BAR": "maybe"}
    program = [sys.executable, "-m", "hvdtrain.launch.cli", f"hydra.run.dir={tmp_path / 'run'}"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode != 0
    # mpirun may stop the second rank before it says the same
    assert "hvdtrain: environment variable HVDTRAIN_PROGRESS_BAR must be 0 or 1, got 'maybe'" in result.stdout
    assert "Traceback" not in result.stdout and not (tmp_path / "run").exists()


def test_a_failing_worker_ends_the_job_with_its_error(image_tree, tmp_path):
    result = run_hvdtrain("recipe=resnet50_imagenet", "cluster=local", f"data.root={image_tree}",
                          "model.num_classes=5", "data.image_size=32", "data.resize_size=32",
                          f"hydra.run.dir={tmp_path / 'run'}", timeout=TIMEOUT)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "failed: ValueError: data.root=" in output and "the model has 5 (model.num_classes)" in output
    assert "the workers failed" in result.stderr


def ranks_validation_sums_are_exact():
    import torch
    import torch.nn.functional as F

    import hvdtrain.torch as hvd
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.data_torch import build_datasets
    from hvdtrain.tasks.models_torch import build_model
    from hvdtrain.training.train_torch import ToDevice, evaluate

    hvd.init()
    cfg = typed({"model": {"name": "digits_cnn", "num_classes": 10}, "data": {"source": "digits", "val_size": 360},
                 "train": {"batch_size": 7}})
    torch.manual_seed(0)
    model = build_model(cfg.model)
    for module in model.modules():  # every rank saw different data: different running statistics
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.fill_(hvd.rank())
    _, val = build_datasets(cfg.data, 10, 0)
    metrics = evaluate(model, val, cfg, ToDevice(torch.device("cpu"), channels_last=False), "none")

    expected_mean = (hvd.size() - 1) / 2
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            assert torch.all(module.running_mean == expected_mean)
    model.eval()
    with torch.no_grad():  # the same model over the whole set, in this one process
        logits = model(val.inputs)
    correct = (logits.argmax(dim=1) == val.labels).sum().item()
    assert metrics["val_top1"] == 100.0 * correct / 360, (metrics, correct)
    in_top5 = (logits.topk(5, dim=1).indices == val.labels[:, None]).any(dim=1).sum().item()
    assert metrics["val_top5"] == 100.0 * in_top5 / 360
    assert metrics["val_loss"] == pytest.approx(F.cross_entropy(logits, val.labels).item(), rel=1e-5)


def test_validation_metrics_are_reduced_exactly(mpirun):
    mpirun(2, ranks_validation_sums_are_exact, timeout=TIMEOUT)
