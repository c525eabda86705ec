"""The Kubernetes job of `launcher=kubernetes`, run for real in podman containers on this machine
(`make container-job`, after `make image`): two worker containers and a launcher container on a
podman network of their own (its own subnet, removed afterwards), started with the commands, the
key layout and the run-directory mount that the printed manifests give the pods; the pods' DNS
names are the containers' host entries. The default recipe trains across the workers to its
target; midway, one worker container is killed and started again, as a StatefulSet restarts its
pod: the job restarts from its checkpoint and finishes, with the restart in results.json.

Exits 0 when all of that held, else 1 with what did not; the containers' output is kept in
build/container_job/ (launcher.log, job-worker-<i>.log).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
NETWORK, SUBNET = "hvdtrain-job", "10.89.77.0/24"
NAME = "job"
OUT = REPO / "build" / "container_job"


def podman(*args, check=True, **options):
    return subprocess.run([*PODMAN, *args], check=check, text=True, capture_output=True, **options)


def manifests(image):
    """The objects `hvdtrain launcher=kubernetes` prints for the default recipe on 2 hosts of 1 rank."""
    command = [sys.executable, "-m", "hvdtrain.launch.cli", "launcher=kubernetes", "cluster=2x1",
               f"kubernetes.image={image}", "kubernetes.runs_claim=runs", f"kubernetes.name={NAME}",
               "fault.restart_wait_s=10"]
    with tempfile.TemporaryDirectory() as where:
        result = subprocess.run(command, cwd=where, capture_output=True, text=True, check=True)
    return {o["kind"]: o for o in yaml.safe_load_all(result.stdout)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="hvdtrain:0.1.0")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--this-tree", action="store_true",
                        help="run this checkout's hvdtrain package in place of the image's (while changing it)")
    options = parser.parse_args()
    objects = manifests(options.image)
    secret = objects["Secret"]["stringData"]
    worker = objects["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    launcher = objects["Job"]["spec"]["template"]["spec"]["containers"][0]
    hosts = launcher["command"][launcher["command"].index("--hosts") + 1].split(",")
    addresses = {host: f"10.89.77.{11 + i}" for i, host in enumerate(hosts)}
    host_entries = [f"--add-host={host}:{ip}" for host, ip in addresses.items()]

    if OUT.exists():
        shutil.rmtree(OUT)
    keys, runs = OUT / "ssh", OUT / "runs"
    keys.mkdir(parents=True)
    runs.mkdir()
    for name, text in secret.items():  # as Kubernetes mounts a Secret: one file per key, read-only
        (keys / name).write_text(text)
        (keys / name).chmod(0o444)
    os.chown(runs, 1000, 1000)  # the image's user, as the pods' fsGroup makes the claim theirs
    mounts = ["-v", f"{keys}:/etc/hvdtrain/ssh:ro", "-v", f"{runs}:/runs", "--shm-size=512m"]
    if options.this_tree:
        mounts += ["-v", f"{REPO / 'hvdtrain'}:/opt/hvdtrain/lib/python3.11/site-packages/hvdtrain:ro"]
    containers = [f"{NAME}-worker-{i}" for i in range(len(hosts))] + [f"{NAME}-launcher"]

    def cleanup():
        for container in containers[:-1]:
            (OUT / f"{container}.log").write_text(podman("logs", container, check=False).stdout)
        podman("rm", "-f", "-t", "0", *containers, check=False)
        podman("network", "rm", "-f", NETWORK, check=False)

    cleanup()
    podman("network", "create", "--subnet", SUBNET, NETWORK)
    failures = []
    try:
        for i, host in enumerate(hosts):
            # A fixed MAC too: started again, the container keeps its address as a pod keeps its
            # name, and the launcher's ARP cache still points at it
            podman("run", "-d", *LIMITS, "--name", containers[i], "--network", NETWORK, "--ip", addresses[host],
                   "--mac-address", f"02:42:0a:59:4d:{11 + i:02x}", "--hostname", host.split(".")[0], *host_entries,
                   *mounts, options.image, *worker["command"])
        log = open(OUT / "launcher.log", "w")
        launch = subprocess.Popen([*PODMAN, "run", *LIMITS, "--name", containers[-1], "--network", NETWORK,
                                   "--ip", "10.89.77.10", *host_entries, *mounts, options.image, *launcher["command"]],
                                  stdout=log, stderr=subprocess.STDOUT, text=True)
        run_dir = runs / NAME
        deadline = time.monotonic() + options.timeout
        while launch.poll() is None and not list((run_dir / "checkpoints").glob("step-*.ckpt")):
            if time.monotonic() > deadline:
                failures.append("no checkpoint before the timeout")
                break
            time.sleep(1)
        if launch.poll() is None and not failures:
            time.sleep(3)  # into the steps after that checkpoint
            podman("kill", containers[1])
            podman("start", containers[1])  # a StatefulSet starts the pod again, under the same name
            print("killed and started again:", containers[1], flush=True)
        try:
            status = launch.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            failures.append(f"the launcher did not end within {options.timeout:g} s")
            status = None
        if status not in (0, None):
            failures.append(f"the launcher exited {status}")
        results_path = run_dir / "results.json"
        if results_path.is_file():
            results = json.loads(results_path.read_text())
            print(json.dumps({key: results[key] for key in ("metrics", "target_reached", "epochs_completed",
                                                              "restarts", "command_time_s") if key in results},
                             indent=2))
            if not results["target_reached"]:
                failures.append(f"the target was not reached: {results['metrics']}")
            if not results["restarts"]:
                failures.append("no restart in results.json")
        else:
            failures.append("no results.json")
    finally:
        cleanup()
    if failures:
        print("container job FAILED: " + "; ".join(failures) + f" (the launcher's output: {OUT / 'launcher.log'})")
        return 1
    print(f"container job passed (the launcher's output: {OUT / 'launcher.log'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
