"""scripts/goyal_study.py, the Goyal study's whole pipeline on a tiny grid (kn = 32 and 64, one
epoch, one seed): the multiruns through `hvdtrain -m` (each job its own distributed run, in its
own directory), the table, the figures, that every run trained at the LR the linear rule and its
warmup give, and --replot; a global batch the ranks cannot split is refused before anything runs."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.reporting.run_log import read_history

from support.commands import run_command

STUDY = Path(__file__).resolve().parents[3] / "scripts" / "goyal_study.py"
BASE_LR, BASE_KN, STEPS = 0.0125, 32, 12  # the recipe's eta for kn = 32; 768 training samples / 64
GRID = ("--batches", "32,64", "--seeds", "0", "--tolerance", "100")


def run_study(where, *args, timeout=300):
    result = run_command([sys.executable, STUDY, *args], cwd=where, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study's output directory and the rows of its table. --tolerance 100: the rule "holds"
    at kn = 64 whatever one epoch reaches, so LARS runs there."""
    where = tmp_path_factory.mktemp("study")
    out = where / "study"
    run_study(where, *GRID, "--out", out, "--sweeps", where / "runs", "train.epochs=1", "data.num_samples=960",
              "schedule.warmup_epochs=0.5", "schedule.milestones=[1]", "train.log_every_steps=1")
    with open(out / "results.csv") as file:
        return out, list(csv.DictReader(file))


def sgd_rows(rows):
    return {row["warmup"]: row for row in rows if row["optimizer"] == "sgd"}


def lrs(row):
    """The LRs a run trained at, step by step."""
    history = read_history(Path(row["run_dir"]) / "metrics.jsonl")
    return [record["lr"] for record in history if record["event"] == "train"][:STEPS]


def test_the_study_runs_each_warmup_and_lars_at_the_larger_batch_and_the_reference_at_the_base(study):
    _, rows = study
    assert sorted((row["optimizer"], row["warmup"], int(row["kn"])) for row in rows) == [
        ("lars", "gradual", 64), ("sgd", "constant", 64), ("sgd", "gradual", 64), ("sgd", "none", 64),
        ("sgd", "reference", 32)]


def test_every_run_peaks_at_the_lr_of_the_linear_rule(study):
    _, rows = study
    for row in rows:
        assert float(row["peak_lr"]) == pytest.approx(float(row["base_lr"]) * int(row["kn"]) / BASE_KN)
    sgd = sgd_rows(rows)
    assert float(sgd["reference"]["peak_lr"]) == BASE_LR and float(sgd["none"]["peak_lr"]) == 2 * BASE_LR


def test_every_row_has_an_error_and_its_epochs(study):
    _, rows = study
    for row in rows:
        assert 0 <= float(row["val_error"]) <= 100 and int(row["epochs"]) == 1


def test_no_warmup_trains_at_the_peak_from_the_first_step(study):
    _, rows = study
    assert lrs(sgd_rows(rows)["none"]) == pytest.approx([2 * BASE_LR] * STEPS)


def test_constant_warmup_trains_at_the_base_lr_then_at_the_peak(study):
    # warmup over 6 of the 12 steps, from eta to the peak 2 eta
    _, rows = study
    assert lrs(sgd_rows(rows)["constant"]) == pytest.approx([BASE_LR] * 6 + [2 * BASE_LR] * 6)


def test_gradual_warmup_rises_from_the_base_lr_to_the_peak(study):
    _, rows = study
    assert lrs(sgd_rows(rows)["gradual"]) == pytest.approx([BASE_LR * (1 + step / 6) for step in range(6)]
                                                           + [2 * BASE_LR] * 6)


def test_replot_makes_the_same_table_from_the_runs_training_nothing(study, tmp_path):
    out, _ = study
    replotted = tmp_path / "replotted"
    run_study(out.parent, *GRID, "--out", replotted, "--sweeps", out.parent / "runs", "--replot")
    assert (replotted / "results.csv").read_text() == (out / "results.csv").read_text()


def test_the_summary_says_how_far_the_rule_holds(study):
    out, _ = study
    summary = (out / "summary.md").read_text()
    assert "up to kn = 64" in summary and "| 64 |" in summary


@pytest.mark.parametrize("figure", ["val_error_vs_kn.png", "training_curves.png"])
def test_the_study_draws_its_figures(study, figure):
    out, _ = study
    assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_run_is_a_distributed_run_in_its_own_directory(study):
    _, rows = study
    run_dirs = {Path(row["run_dir"]) for row in rows}
    assert len(run_dirs) == len(rows)
    assert all(json.loads((run_dir / "results.json").read_text())["world_size"] == 2 for run_dir in run_dirs)


def test_a_global_batch_the_ranks_cannot_split_is_refused_before_anything_runs(tmp_path):
    result = subprocess.run([sys.executable, str(STUDY), "--batches", "32,65", "--sweeps", tmp_path / "runs"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == "goyal_study: --batches: 65 is not a multiple of the 2 ranks"
    assert not (tmp_path / "runs").exists()
