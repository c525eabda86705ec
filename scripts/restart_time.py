"""How long a restart takes: from a rank killed by SIGKILL to the first training step after it.

Two cases, each run in rounds; the median is printed:
- `hvdtrain` (the digits recipe on 2 local ranks, long enough not to end first; extra arguments
  are passed on): rank 1 is killed once the run has checkpointed; rank 0's heartbeat file
  (runner/supervisor.py) shows the first step after the checkpoint it resumes from.
  fault.restart_wait_s is set to 0 here: add it (5 s by default, doubling) to what a user waits.
  With --netns-hosts N the ranks run one on each of N network-namespace hosts made as the cluster
  tests make them (tests/cluster/netns_cluster.py; root, iproute2).
- `--elastic`: a Horovod Elastic PyTorch script (a small model, a commit every 5 steps, each step
  logged with its time) under `hvdtrun --host-discovery-script` on 2 local ranks: rank 1 is
  killed after step 20; hvdtrun starts the job again and the script goes on from its last commit.

    .venv/bin/python scripts/restart_time.py [--rounds 3] [--elastic | --netns-hosts N] [HVDTRAIN_ARGS ...]
"""

import argparse
import contextlib
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvdtrain.launch import supervisor
from hvdtrain.training import checkpoint


def rank_pid(run_dir, rank):
    return rank_pid_of(f"hvdtrain.training.worker\0{run_dir}", rank)


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
    process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.cli", "train.epochs=1000",
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


ELASTIC_SCRIPT = """
import sys, time
import torch
import hvdtrain.torch as hvd

hvd.init()
model = torch.nn.Linear(64, 64)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())

@hvd.elastic.run
def train(state):
    while state.step < 100000:
        optimizer.zero_grad()
        model(torch.randn(32, 64)).square().mean().backward()
        optimizer.step()
        state.step += 1
        if hvd.rank() == 0:
            with open(sys.argv[1], "a") as log:
                log.write(f"{state.step} {time.time()}\\n")
        if state.step % 5 == 0:
            state.commit()
        time.sleep(0.01)

train(hvd.elastic.TorchState(model, optimizer, step=0))
"""


def one_elastic_round(directory, extra):
    directory = Path(directory)
    (directory / "train.py").write_text(ELASTIC_SCRIPT)
    (directory / "discover.sh").write_text("#!/bin/sh\necho localhost:2\n")
    (directory / "discover.sh").chmod(0o755)
    progress = directory / "progress.txt"
    process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.hvdtrun.command", "--host-discovery-script",
                                str(directory / "discover.sh"), "--min-np", "2", *extra, sys.executable,
                                str(directory / "train.py"), str(progress)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def steps():
        return [line.split() for line in progress.read_text().splitlines()] if progress.exists() else []

    try:
        wait_for(lambda: len(steps()) >= 20)
        victim = wait_for(lambda: rank_pid_of(str(directory / "train.py"), 1))
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        # the first step the new job logs (the killed one cannot make a step without rank 1)
        after = wait_for(lambda: next((float(t) for _, t in steps() if float(t) > killed + 0.5), None))
        return after - killed
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def rank_pid_of(script, rank):
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or script.encode() not in (proc / "cmdline").read_bytes():
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            pass
    return None


def netns_hosts(count, stack):
    """`count` namespace hosts, removed when `stack` closes."""
    path = Path(__file__).resolve().parent.parent / "tests" / "cluster" / "netns_cluster.py"
    spec = importlib.util.spec_from_file_location("netns_cluster", path)
    netns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(netns)
    missing = netns.missing_requirements()
    if missing:
        raise SystemExit(f"restart_time: {missing}")
    return netns.netns_cluster(count, stack.enter_context(tempfile.TemporaryDirectory(prefix="hvdtrain-hosts-")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--elastic", action="store_true", help="a Horovod Elastic script under hvdtrun")
    parser.add_argument("--netns-hosts", type=int, default=0, help="hvdtrain on this many namespace hosts")
    args, extra = parser.parse_known_args()
    with contextlib.ExitStack() as hosts:
        if args.netns_hosts:
            cluster = hosts.enter_context(netns_hosts(args.netns_hosts, hosts))
            quoted = ",".join(f"'{arg}'" for arg in cluster.mpirun_args())
            extra = [f"cluster={args.netns_hosts}x1", f"cluster.hosts=[{','.join(h.address for h in cluster.hosts)}]",
                     f"cluster.mpirun_args=[{quoted}]", *extra]
        times = []
        for round_number in range(args.rounds):
            with tempfile.TemporaryDirectory() as directory:
                times.append((one_elastic_round if args.elastic else one_round)(directory, extra))
        print(f"round {round_number + 1}: {times[-1]:.2f} s from the kill to the first step after the restart", flush=True)
    print(f"median of {len(times)}: {statistics.median(times):.2f} s ({', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
