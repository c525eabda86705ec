"""The Goyal study's whole pipeline on a tiny grid (kn = 32 and 64, one epoch, one seed): the
multiruns through `hvdtrain -m` (each job its own distributed run, in its own directory), the
table, the figures, and that every run trained at the LR the linear rule and its warmup give."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.reporting.run_log import read_history

from support.commands import run_command

STUDY = Path(__file__).resolve().parents[2] / "scripts" / "goyal_study.py"
BASE_LR, BASE_KN, STEPS = 0.0125, 32, 12  # the recipe's eta for kn = 32; 768 training samples / 64


def run_study(tmp_path, *args, timeout=300):
    result = run_command([sys.executable, STUDY, *args], cwd=tmp_path, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_tiny_study_applies_the_rule_and_each_warmup_and_writes_its_table_and_figures(tmp_path):
    out = tmp_path / "study"
    # --tolerance 100: the rule "holds" at kn = 64 whatever one epoch reaches, so LARS runs there.
    run_study(tmp_path, "--batches", "32,64", "--seeds", "0", "--tolerance", "100", "--out", out,
              "--sweeps", tmp_path / "runs", "train.epochs=1", "data.num_samples=960", "schedule.warmup_epochs=0.5",
              "schedule.milestones=[1]", "train.log_every_steps=1")

    with open(out / "results.csv") as file:
        rows = list(csv.DictReader(file))
    assert sorted((row["optimizer"], row["warmup"], int(row["kn"])) for row in rows) == [
        ("lars", "gradual", 64), ("sgd", "constant", 64), ("sgd", "gradual", 64), ("sgd", "none", 64),
        ("sgd", "reference", 32)]
    for row in rows:
        assert float(row["peak_lr"]) == pytest.approx(float(row["base_lr"]) * int(row["kn"]) / BASE_KN)
        assert 0 <= float(row["val_error"]) <= 100 and int(row["epochs"]) == 1
    sgd = {row["warmup"]: row for row in rows if row["optimizer"] == "sgd"}
    assert float(sgd["reference"]["peak_lr"]) == BASE_LR and float(sgd["none"]["peak_lr"]) == 2 * BASE_LR

    # The LRs each run trained at: warmup over 6 of the 12 steps, from eta to the peak 2 eta.
    def lrs(warmup):
        history = read_history(Path(sgd[warmup]["run_dir"]) / "metrics.jsonl")
        return [record["lr"] for record in history if record["event"] == "train"][:STEPS]

    peak = 2 * BASE_LR
    assert lrs("none") == pytest.approx([peak] * STEPS)
    assert lrs("constant") == pytest.approx([BASE_LR] * 6 + [peak] * 6)
    assert lrs("gradual") == pytest.approx([BASE_LR * (1 + step / 6) for step in range(6)] + [peak] * 6)

    # --replot makes the same table again from the runs, training nothing.
    replotted = tmp_path / "replotted"
    run_study(tmp_path, "--batches", "32,64", "--seeds", "0", "--tolerance", "100", "--out", replotted,
              "--sweeps", tmp_path / "runs", "--replot")
    assert (replotted / "results.csv").read_text() == (out / "results.csv").read_text()

    summary = (out / "summary.md").read_text()
    assert "up to kn = 64" in summary and "| 64 |" in summary
    for figure in ("val_error_vs_kn.png", "training_curves.png"):
        assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run_dirs = {Path(row["run_dir"]) for row in rows}
    assert len(run_dirs) == len(rows)
    assert all(json.loads((run_dir / "results.json").read_text())["world_size"] == 2 for run_dir in run_dirs)


def test_a_global_batch_the_ranks_cannot_split_is_refused_before_anything_runs(tmp_path):
    result = subprocess.run([sys.executable, str(STUDY), "--batches", "32,65", "--sweeps", tmp_path / "runs"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == "goyal_study: --batches: 65 is not a multiple of the 2 ranks"
    assert not (tmp_path / "runs").exists()
