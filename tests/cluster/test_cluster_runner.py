"""`hvdtrain` itself on a 2 x 2 cluster of network-namespace hosts."""

import json

from runner.support import run_hvdtrain


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
