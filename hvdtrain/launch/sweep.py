"""The summary of a sweep (`hvdtrain -m KEY=A,B ...`): one row per job, its overrides and its result,
printed when the last job has ended and kept as summary.md in the sweep's directory.

A Hydra callback: each job notes its overrides in its run directory as it ends (where it ran:
here, or in its own Slurm job), and the command that ran the sweep reads them back with each
job's results.json.
"""

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from hydra.types import RunMode

OVERRIDES = "overrides.json"


class SweepSummary(Callback):
    def on_job_end(self, config, job_return, **kwargs):
        if job_return.hydra_cfg.hydra.mode != RunMode.MULTIRUN:
            return
        run_dir = Path(job_return.hydra_cfg.hydra.runtime.output_dir)
        if run_dir.is_dir():
            (run_dir / OVERRIDES).write_text(json.dumps(list(job_return.overrides)))

    def on_multirun_end(self, config, **kwargs):
        sweep_dir = Path(config.hydra.sweep.dir)
        table = summary_table(sweep_dir)
        if table is None:
            return
        (sweep_dir / "summary.md").write_text(table + "\n")
        print(f"hvdtrain: the sweep's jobs (also in {sweep_dir / 'summary.md'}):\n{table}", flush=True)


def summary_table(sweep_dir):
    """A Markdown table of the jobs under `sweep_dir` that noted their overrides, in job order;
    None where there are none (a sweep of dry runs)."""
    jobs = sorted((path.parent for path in Path(sweep_dir).glob(f"*/{OVERRIDES}")),
                  key=lambda job: (not job.name.isdigit(), int(job.name) if job.name.isdigit() else job.name))
    if not jobs:
        return None
    rows = ["| job | overrides | result | target | epochs | command time |", "|---|---|---|---|---|---|"]
    for job in jobs:
        overrides = " ".join(json.loads((job / OVERRIDES).read_text()))
        results_path = job / "results.json"
        if not results_path.is_file():
            rows.append(f"| {job.name} | `{overrides}` | no results.json | | | |")
            continue
        results = json.loads(results_path.read_text())
        target = results["target"]
        if target is None:
            result, reached = ", ".join(f"{k} {v:.4g}" for k, v in results["metrics"].items()), ""
        else:
            achieved = results["metrics"].get(target["metric"])
            result = f"{target['metric']} {achieved:.4g}" if achieved is not None else "not measured"
            reached = f"{target['value']:g}: {'reached' if results['target_reached'] else 'not reached'}"
        took = "" if results.get("command_time_s") is None else f" {results['command_time_s']:.0f} s"
        rows.append(f"| {job.name} | `{overrides}` | {result} | {reached} | "
                    f"{results['epochs_completed']} of {results['epochs']} |{took} |")
    return "\n".join(rows)
