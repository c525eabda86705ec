"""A rank that fails on a remote host ends the whole job with an error, instead of a hang; a host
lost for good is left out by `hvdtrain`, which goes on with the hosts that remain."""

import subprocess
import sys
import time

import numpy as np

FAILING_RANK = 2  # on the second host, with 1 rank on the first and 2 on the second


def ranks_one_remote_rank_fails():
    from hvdtrain import core

    core.init()
    core.allreduce_async(np.ones(4), name="before", op=core.ReduceOp.SUM).wait()  # every host is up
    if core.rank() == FAILING_RANK:
        raise RuntimeError(f"rank {FAILING_RANK} fails on purpose")
    core.allreduce_async(np.ones(4), name="after", op=core.ReduceOp.SUM).wait()  # waits for the failed rank


def test_failure_on_a_remote_host_ends_the_job(netns_cluster, cluster_mpirun):
    result = cluster_mpirun((1, 2), ranks_one_remote_rank_fails, timeout=120, expect_success=False)
    assert result.returncode != 0, result.stdout
    assert f"rank {FAILING_RANK} fails on purpose" in result.stdout
    # Nothing of the job may go on running on any host once mpirun has returned.
    deadline = time.monotonic() + 10
    while any(host.processes() for host in netns_cluster.hosts) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(host.processes() for host in netns_cluster.hosts), \
        {host.namespace: host.processes() for host in netns_cluster.hosts}


def test_a_lost_host_is_left_out_and_the_run_goes_on_with_the_same_global_batch(netns_cluster, tmp_path):
    """All processes of the third host are killed and its address taken away (the remote agent
    can no longer reach it): hvdtrain restarts the run on the two hosts left, with 3 backward
    passes a step in place of 2, so that the global batch stays 192, and ends where a run that
    never lost a host does."""
    # here, not at the top: the ranks of the other test load this file without the tests' path
    from netns_cluster import ip
    from support.commands import processes_mentioning, results_of, run_hvdtrain, wait_until

    settings = ["train.batch_size=32", "train.backward_passes_per_step=2", "train.log_every_steps=2",
                "train.checkpoint_every_s=0.000001", "fault.restart_wait_s=0.5"]
    hosts = ",".join(host.address for host in netns_cluster.hosts)
    mpirun_args = ",".join(f"'{arg}'" for arg in netns_cluster.mpirun_args())
    run_dir, lost = tmp_path / "run", netns_cluster.hosts[2]
    with open(tmp_path / "run.log", "w+") as log:
        process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.cli", "cluster=3x1", f"cluster.hosts=[{hosts}]",
                                    f"cluster.mpirun_args=[{mpirun_args}]", "fault.min_hosts=2", *settings,
                                    f"hydra.run.dir={run_dir}"], stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: len(list((run_dir / "checkpoints").glob("step-*.ckpt"))) >= 3, 180, "3 checkpoints")
            ip("-n", lost.namespace, "addr", "del", f"{lost.address}/24", "dev", "eth0")
            lost.kill_processes()
            process.wait(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
            ip("-n", lost.namespace, "addr", "add", f"{lost.address}/24", "dev", "eth0")
        log.seek(0)
        output = log.read()
    assert process.returncode == 0, output
    assert (f"hvdtrain: host {lost.address} does not answer; going on with 2 of 3 hosts, 2 ranks, the global batch "
            f"of 192 kept by train.backward_passes_per_step=3 (it was 2)") in output
    results = results_of(run_dir)
    assert (results["world_size"], results["global_batch_size"], results["epochs_completed"]) == (2, 192, 12)
    [restart] = results["restarts"]
    assert restart["hosts_before"] == [f"{h.address}:1" for h in netns_cluster.hosts]
    assert restart["hosts_after"] == [f"{h.address}:1" for h in netns_cluster.hosts[:2]]
    assert not processes_mentioning(str(run_dir))

    never_lost = run_hvdtrain("cluster=1x3", *settings, f"hydra.run.dir={tmp_path / 'never_lost'}", timeout=240)
    assert never_lost.returncode == 0, never_lost.stdout + never_lost.stderr
    expected = results_of(tmp_path / "never_lost")
    assert expected["global_batch_size"] == 192 and expected["samples_trained"] == results["samples_trained"]
    assert abs(results["metrics"]["val_top1"] - expected["metrics"]["val_top1"]) <= 1.5, (results, expected)
