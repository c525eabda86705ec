"""The summary of a sweep (hvdtrain/launch/sweep.py): each job notes its overrides as it ends, and
the table made of them and the jobs' results.json is printed and kept as summary.md."""

import json
from types import SimpleNamespace

from hydra.types import RunMode
from omegaconf import OmegaConf

from hvdtrain.launch.sweep import SweepSummary

TABLE = """| job | overrides | result | target | epochs | command time |
|---|---|---|---|---|---|
| 0 | `optimizer.base_lr=0.05` | val_top1 96.5 | 95: reached | 12 of 12 | 31 s |
| 1 | `optimizer.base_lr=5` | no results.json | | | |
| 10 | `optimizer.base_lr=0.1` | val_top1 94.25 | 95: not reached | 3 of 12 | |"""


def _job_ended(callback, run_dir, overrides, mode=RunMode.MULTIRUN):
    """What Hydra calls as a job ends: the job's Hydra config and overrides in a JobReturn."""
    run_dir.mkdir(parents=True)
    hydra = SimpleNamespace(hydra=SimpleNamespace(mode=mode, runtime=SimpleNamespace(output_dir=str(run_dir))))
    callback.on_job_end(None, SimpleNamespace(hydra_cfg=hydra, overrides=overrides))


def _results(run_dir, top1, reached, epochs, **extra):
    (run_dir / "results.json").write_text(json.dumps({
        "target": {"metric": "val_top1", "value": 95.0, "source": "ours"}, "metrics": {"val_top1": top1},
        "target_reached": reached, "epochs_completed": epochs, "epochs": 12, **extra}))


def test_the_sweep_prints_and_keeps_a_row_per_job_in_job_order(tmp_path, capsys):
    callback = SweepSummary()
    _job_ended(callback, tmp_path / "10", ["optimizer.base_lr=0.1"])
    _job_ended(callback, tmp_path / "0", ["optimizer.base_lr=0.05"])
    _job_ended(callback, tmp_path / "1", ["optimizer.base_lr=5"])
    _results(tmp_path / "0", 96.5, True, 12, command_time_s=31.2)
    _results(tmp_path / "10", 94.25, False, 3)
    callback.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert (tmp_path / "summary.md").read_text() == TABLE + "\n"
    assert capsys.readouterr().out == f"hvdtrain: the sweep's jobs (also in {tmp_path / 'summary.md'}):\n{TABLE}\n"


def test_a_sweep_of_dry_runs_has_no_summary(tmp_path, capsys):
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert capsys.readouterr().out == "" and list(tmp_path.iterdir()) == []


def test_a_single_run_notes_nothing(tmp_path):
    _job_ended(SweepSummary(), tmp_path / "run", ["train.epochs=1"], mode=RunMode.RUN)
    assert list((tmp_path / "run").iterdir()) == []
