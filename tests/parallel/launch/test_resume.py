"""`hvdtrain resume=RUN_DIR` on real runs (hvdtrain/launch/resume.py): it refuses overrides other
than train.epochs and train.device; a finished run is not resumed and nothing of it changes; a
crashed run moved to train.device=cpu says so and its workers train there; extending a cosine run
says what becomes of its schedule; a constant-schedule run extended ends as one started with its
new epochs; extending to no more epochs than done is refused. The resumes that end before
anything is launched run in this process."""

import pytest

from hvdtrain.run.plan import read_plans

from support.commands import assert_the_figures_divide, history, hvdtrain_here, results_of, run_hvdtrain

from parallel.runs import TIMEOUT, assert_same_weights


def files_of(run_dir):
    return {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}


def test_resume_refuses_other_overrides(default_run, monkeypatch):
    run_dir, _ = default_run
    result = hvdtrain_here(f"resume={run_dir}", "optimizer.base_lr=0.2", monkeypatch=monkeypatch)
    assert result.returncode != 0 and result.stderr == (
        f"hvdtrain: resume={run_dir} continues that run with its saved config.yaml; it cannot be combined with "
        f"optimizer.base_lr=0.2 (only train.epochs=N, which extends it, and train.device=..., which moves it to "
        f"other hardware)\n")


@pytest.fixture(scope="module")
def finished_resumed(default_run):
    """(what `hvdtrain resume=RUN_DIR` of the finished default run gave, the run's files before,
    its files after)."""
    run_dir, _ = default_run
    before = files_of(run_dir)
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = hvdtrain_here(f"resume={run_dir}", monkeypatch=monkeypatch)
    return result, before, files_of(run_dir)


def test_resuming_a_finished_run_says_so(default_run, finished_resumed):
    run_dir, _ = default_run
    result, _, _ = finished_resumed
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == (f"hvdtrain: {run_dir} finished all 12 epochs; nothing to resume "
                             f"(extend it with resume={run_dir} train.epochs=M)\n")


def test_resuming_a_finished_run_changes_nothing(finished_resumed):
    _, before, after = finished_resumed
    assert after == before


@pytest.fixture(scope="module")
def cosine_extended(default_run):
    """((the first line `hvdtrain resume=RUN_DIR train.epochs=14 dry_run=true` printed for the
    default run, whose schedule is cosine, and the plan it printed); the run's files before; after)."""
    run_dir, _ = default_run
    before = files_of(run_dir)
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = hvdtrain_here(f"resume={run_dir}", "train.epochs=14", "dry_run=true", monkeypatch=monkeypatch)
    assert result.returncode == 0, result.stdout + result.stderr
    return (result.stdout.splitlines()[0], read_plans(result.stdout)[0]), before, files_of(run_dir)


def test_extending_a_cosine_run_says_what_becomes_of_its_schedule(default_run, cosine_extended):
    run_dir, _ = default_run
    (notice, _), _, _ = cosine_extended
    assert notice == (f"hvdtrain: extending {run_dir} from 12 to 14 epochs; its cosine decay is stretched to end "
                      f"at epoch 14: from epoch 12 on the LR follows the 14-epoch curve, so the result is not that "
                      f"of a run started with train.epochs=14")


def test_the_plan_of_an_extended_run_has_its_new_epochs(cosine_extended):
    (_, plan), _, _ = cosine_extended
    assert plan["epochs"] == 14


def test_a_dry_run_of_an_extension_writes_nothing(cosine_extended):
    _, before, after = cosine_extended
    assert after == before


def test_a_run_moved_to_the_cpu_says_so(crashed_and_resumed):
    run_dir, result = crashed_and_resumed
    assert f"hvdtrain: {run_dir} goes on with train.device=cpu (it was started with train.device=auto)" in result.stdout


def test_the_summary_of_a_moved_run_shows_its_new_device(crashed_and_resumed):
    _, result = crashed_and_resumed
    assert "  device       cpu (train.device=cpu)" in result.stdout


def test_a_moved_runs_device_is_where_its_workers_read_it(crashed_and_resumed):
    run_dir, _ = crashed_and_resumed
    assert "  device: cpu\n" in (run_dir / "config.yaml").read_text()


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory):
    """The digits recipe at a constant LR for 2 epochs, run to the end, then extended to 3 as
    CONSTANT trains them at once: (run dir, what the extension printed)."""
    run_dir = tmp_path_factory.mktemp("extended") / "run"
    for args in (["schedule=constant", "train.epochs=2", f"hydra.run.dir={run_dir}"],
                 [f"resume={run_dir}", "train.epochs=3"]):
        result = run_hvdtrain(*args, timeout=TIMEOUT)
        assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, result


def test_extending_a_constant_run_says_it_trains_on_as_a_longer_run_would(extended_run):
    run_dir, result = extended_run
    assert (f"hvdtrain: extending {run_dir} from 2 to 3 epochs; its constant schedule does not depend on "
            f"train.epochs: it trains on as a run started with train.epochs=3 would") in result.stdout


def test_an_extended_run_goes_on_from_the_end_of_its_epochs(extended_run):
    _, result = extended_run
    assert "hvdtrain: resuming at epoch 2, step 0" in result.stdout


def test_an_extended_run_saves_its_new_epochs(extended_run):
    run_dir, _ = extended_run
    assert "train:\n  epochs: 3\n" in (run_dir / "config.yaml").read_text()


def test_an_extended_run_ends_with_the_weights_of_one_started_with_its_new_epochs(extended_run, constant_run):
    run_dir, _ = extended_run
    _, constant, _ = constant_run
    assert_same_weights(run_dir, constant, 3 * 22)


def test_an_extended_run_ends_with_the_history_of_one_started_with_its_new_epochs(extended_run, constant_run):
    run_dir, _ = extended_run
    _, constant, _ = constant_run
    assert history(run_dir) == history(constant)


def test_an_extended_run_ends_with_the_results_of_one_started_with_its_new_epochs(extended_run, constant_run):
    run_dir, _ = extended_run
    _, constant, _ = constant_run
    results = results_of(run_dir)
    assert (results["epochs_completed"], results["epochs"]) == (3, 3)
    assert results["metrics"] == results_of(constant)["metrics"]
    assert_the_figures_divide(results, samples_trained=3 * 22 * 64)


@pytest.mark.parametrize("epochs", [3, 2])
def test_extending_to_no_more_epochs_than_done_is_refused_with_the_numbers(extended_run, epochs, monkeypatch):
    run_dir, _ = extended_run
    before = files_of(run_dir)
    result = hvdtrain_here(f"resume={run_dir}", f"train.epochs={epochs}", monkeypatch=monkeypatch)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"hvdtrain: train.epochs={epochs}: {run_dir} has done 3 of its 3 epochs already; "
                             f"resume={run_dir} train.epochs=N trains on to N epochs, N more than 3\n")
    assert files_of(run_dir) == before
