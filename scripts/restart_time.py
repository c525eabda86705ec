"""How long a restart takes: from a rank killed by SIGKILL to the first training step after it.

Runs `hvdtrain` (the digits recipe on 2 local ranks, long enough not to end first; any extra
arguments are passed on), kills rank 1 once the run has checkpointed, and watches rank 0's
heartbeat file (runner/supervisor.py) for the first step after the checkpoint it resumes from.
Prints one line per round and the median; fault.restart_wait_s is set to 0 here, so add it
(5 s by default, doubling with each restart) to what a user waits.

    .venv/bin/python scripts/restart_time.py [--rounds 3] [HVDTRAIN_ARGS ...]
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvdtrain.runner import supervisor
from hvdtrain.training import checkpoint


def rank_pid(run_dir, rank):
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or f"hvdtrain.runner.worker\0{run_dir}".encode() not in (proc / "cmdline").read_bytes():
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            pass
    return None


def wait_for(condition, timeout=300):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("the run did not get there in time")
        time.sleep(0.005)


def one_round(directory, extra):
    run_dir = Path(directory) / "run"
    process = subprocess.Popen([sys.executable, "-m", "hvdtrain.runner.cli", "train.epochs=1000",
                                "train.checkpoint_every_steps=50", "fault.restart_wait_s=0", *extra,
                                f"hydra.run.dir={run_dir}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: checkpoint.newest_metadata(run_dir / "checkpoints"))
        victim = wait_for(lambda: rank_pid(run_dir, 1))
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: "restart" in (run_dir / "metrics.jsonl").read_text())
        resumed_from = checkpoint.newest_metadata(run_dir / "checkpoints")["global_step"]
        beat = wait_for(lambda: (lambda b: b if b and b[1] > resumed_from else None)(supervisor.last_beat(run_dir)))
        return beat[0] - killed
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args, extra = parser.parse_known_args()
    times = []
    for round_number in range(args.rounds):
        with tempfile.TemporaryDirectory() as directory:
            times.append(one_round(directory, extra))
        print(f"round {round_number + 1}: {times[-1]:.2f} s from the kill to the first step after the restart", flush=True)
    print(f"median of {len(times)}: {statistics.median(times):.2f} s")


if __name__ == "__main__":
    main()
