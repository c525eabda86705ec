"""How long hvdtrain takes on the test Slurm cluster (tests/cluster/slurm_cluster.py, 2 nodes on
this machine; root): from `sbatch` to the first training step, and from a preemption notice to
the end of the job's run, for the notice ahead of the time limit (`scancel --batch --signal=USR1`,
what `#SBATCH --signal=B:USR1@120` sends) and for `scontrol requeue` (SIGTERM to every process).

    python scripts/slurm_times.py [--rounds 3]       (make slurm-times)

Each round submits the digits recipe on 2 nodes x 1 task with mpirun starting the ranks, sends
the notice once the run is at step 50, and cancels the requeued job. Medians go to
studies/slurm_times/times.json and are printed.
"""

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "cluster"))
from restart_time import wait_for  # noqa: E402  (scripts/, this file's directory, is on sys.path)
from slurm_cluster import missing_requirements, slurm_cluster  # noqa: E402

HVDTRAIN = Path(sys.executable).with_name("hvdtrain")
RUN = "recipe=digits cluster=2x1 train.epochs=100 train.checkpoint_every_s=5"
NOTICES = {"USR1 to the batch shell": ("scancel", "--batch", "--signal=USR1"),
           "scontrol requeue": ("scontrol", "requeue")}
STOPPED = re.compile(r"the job stopped with a checkpoint ([0-9.]+) s after hvdtrain received")


def heartbeat_step(run_dir):
    try:
        return int((run_dir / ".heartbeat").read_text() or 0)
    except (OSError, ValueError):
        return 0


def one_round(cluster, notice):
    """(seconds from sbatch to the first step, from the notice to the end of the ranks as
    hvdtrain measured it: from its own receipt of the signal, which Slurm sends to every process
    of the job at once, to its mpirun's exit)."""
    submitted = time.time()
    job = cluster.submit(f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --requeue\n"
                         f"exec {HVDTRAIN} {RUN}\n")
    run_dir = cluster.output_dir / "runs" / "digits" / f"slurm-{job}"
    wait_for(lambda: heartbeat_step(run_dir) >= 1, 120)
    first_step = time.time() - submitted
    wait_for(lambda: heartbeat_step(run_dir) >= 50, 120)
    cluster.run(*NOTICES[notice], job)
    stopped = wait_for(lambda: STOPPED.search(cluster.output(job)), 120)
    cluster.run("scancel", job, check=False)  # the requeued run is not needed
    cluster.wait_for_job_state(job, "CANCELLED", "COMPLETED", timeout=120)
    return first_step, float(stopped[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    missing = missing_requirements()
    if missing:
        sys.exit(f"slurm_times.py: {missing}")
    work_dir = Path(tempfile.mkdtemp(prefix="hvdtrain-slurm-times-"))
    first_steps, stops = [], {notice: [] for notice in NOTICES}
    with slurm_cluster(work_dir, kill_wait_s=30) as cluster:
        for _ in range(args.rounds):
            for notice in NOTICES:
                first_step, stopped = one_round(cluster, notice)
                first_steps.append(first_step)
                stops[notice].append(stopped)
                print(f"{notice}: sbatch to first step {first_step:.2f} s, notice to the job's exit {stopped:.2f} s",
                      flush=True)
    result = {"rounds": args.rounds, "run": RUN,
              "sbatch_to_first_step_s": round(statistics.median(first_steps), 2),
              "notice_to_exit_s": {notice: round(statistics.median(times), 2) for notice, times in stops.items()}}
    shutil.rmtree(work_dir, ignore_errors=True)
    study = REPO / "studies" / "slurm_times"
    study.mkdir(parents=True, exist_ok=True)
    (study / "times.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
