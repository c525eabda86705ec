"""`hvdtrain` itself on a 2 x 2 cluster of network-namespace hosts, which share no file system
where the run directory lies (see conftest.py): only rank 0, on the first host, may use it."""

import json
import sys

from hvdtrain.launch import mpirun as launcher
from hvdtrain.run.hosts import Host
from support.commands import run_hvdtrain


def run_on_two_hosts(netns_cluster, python_args, timeout=240):
    """`python PYTHON_ARGS` under mpirun on one rank on each of the first two hosts."""
    hosts = [Host(host.address, 1) for host in netns_cluster.hosts[:2]]
    environment = launcher.worker_environment(1)
    command = launcher.mpirun_command([sys.executable, "-u", *python_args], hosts, env=environment,
                                      extra_args=netns_cluster.mpirun_args())
    return launcher.run(command, env=environment, timeout=timeout, capture=True)


def test_hvdtrain_trains_across_hosts(netns_cluster, tmp_path):
    hosts = ",".join(host.address for host in netns_cluster.hosts[:2])
    mpirun_args = ",".join(f"'{arg}'" for arg in netns_cluster.mpirun_args())  # quoted: one has commas
    result = run_hvdtrain("cluster=2x4", "cluster.slots=2", f"cluster.hosts=[{hosts}]",
                          f"cluster.mpirun_args=[{mpirun_args}]", "train.epochs=2", cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    (results_file,) = tmp_path.glob("runs/digits/*/results.json")
    results = json.loads(results_file.read_text())
    assert results["world_size"] == 4
    assert results["epochs_completed"] == 2
    assert results["metrics"]["val_top1"] > 80, results


def test_hvdtrain_inside_an_mpirun_job_across_hosts(netns_cluster, tmp_path):
    # Every rank composes the config; rank 0's, and its run directory, become the run's.
    run_dir = tmp_path / "run"
    result = run_on_two_hosts(netns_cluster, ["-m", "hvdtrain.launch.cli", "train.epochs=1", f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["world_size"], results["epochs_completed"]) == (2, 1), results


def test_a_run_directory_without_its_config_stops_every_host_with_one_error(netns_cluster, tmp_path):
    run_dir = tmp_path / "not-a-run"
    run_dir.mkdir()
    result = run_on_two_hosts(netns_cluster, ["-m", "hvdtrain.training.worker", str(run_dir)])
    assert result.returncode != 0, result.stdout
    error = (f"hvdtrain: rank 0 cannot read the run's config {run_dir / 'config.yaml'}: FileNotFoundError: "
             f"[Errno 2] No such file or directory: '{run_dir / 'config.yaml'}'")
    assert result.stdout.count(error) == 1, result.stdout
    assert "Traceback" not in result.stdout, result.stdout
