"""A rank that fails on a remote host ends the whole job with an error, instead of a hang; a host
lost for good is left out by `hvdtrain`, which goes on with the hosts that remain, and blacklisted
by `hvdtrun`'s elastic driver, which starts a Horovod Elastic script again on the others; a
plain hvdtrun job that loses a host fails, although mpirun ends with status 0."""

import shutil
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


ELASTIC_SCRIPT = """
import sys, time
import torch
import hvdtrain.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())

@hvd.elastic.run
def train(state):
    while state.step < 60:
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        state.step += 1
        if hvd.rank() == 0:
            print(f"step {state.step} on {hvd.size()} ranks", flush=True)
        state.commit()
        time.sleep(0.2)

train(hvd.elastic.TorchState(model, optimizer, step=0))
"""


def hvdtrun_losing_a_host(netns_cluster, tmp_path, script_text, flags, steps_before):
    """(hvdtrun's status, its output) for `script_text` run on the cluster's hosts by `hvdtrun
    FLAGS`, the third host taken away (its address, then all its processes) once rank 0 has
    printed "step STEPS_BEFORE on 3 ranks"."""
    import shlex
    import tempfile
    from pathlib import Path

    from netns_cluster import ip
    from support.commands import wait_until

    lost = netns_cluster.hosts[2]
    # The script where every host sees it (the tests' temporary directory is the first host's alone)
    shared = Path(tempfile.mkdtemp(prefix="hvdtrain-hvdtrun-", dir=Path(__file__).resolve().parent))
    script, log_path = shared / "script.py", tmp_path / "hvdtrun.log"
    script.write_text(script_text)
    with open(log_path, "w+") as log:
        process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.hvdtrun.command", *flags,
                                    "--mpi-args", shlex.join(netns_cluster.mpirun_args()),
                                    sys.executable, str(script)], stdout=log, stderr=subprocess.STDOUT, text=True)
        taken_away = False
        try:
            wait_until(lambda: f"step {steps_before} on 3 ranks" in log_path.read_text(), 180,
                       f"{steps_before} steps on 3 ranks")
            ip("-n", lost.namespace, "addr", "del", f"{lost.address}/24", "dev", "eth0")
            taken_away = True
            lost.kill_processes()
            process.wait(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
            if taken_away:
                ip("-n", lost.namespace, "addr", "add", f"{lost.address}/24", "dev", "eth0")
            shutil.rmtree(shared)
        log.seek(0)
        return process.returncode, log.read()


def test_a_host_lost_from_an_elastic_job_is_blacklisted_and_the_job_goes_on_without_it(netns_cluster, tmp_path):
    """The discovery script lists all three hosts throughout; the third is taken away mid-run:
    hvdtrun finds that it does not answer, blacklists it, and starts the script again on the two
    others from its last commit."""
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\n" + "".join(f"echo {host.address}:1\n" for host in netns_cluster.hosts))
    discover.chmod(0o755)
    status, output = hvdtrun_losing_a_host(
        netns_cluster, tmp_path, ELASTIC_SCRIPT,
        ["--min-np", "2", "--host-discovery-script", str(discover), "--reset-limit", "2"], steps_before=10)
    assert status == 0, output
    assert f"hvdtrun: host {netns_cluster.hosts[2].address} does not answer; it is blacklisted for good" in output, \
        output
    assert "step 60 on 2 ranks" in output, output


PLAIN_SCRIPT = """
import time
import torch
import hvdtrain.torch as hvd

hvd.init()
for step in range(1, 300):
    hvd.allreduce(torch.ones(4), name="step")
    if hvd.rank() == 0:
        print(f"step {step} on {hvd.size()} ranks", flush=True)
    time.sleep(0.2)
"""


def test_a_plain_job_that_loses_a_host_fails_even_where_mpirun_ends_with_status_0(netns_cluster, tmp_path):
    """Open MPI 5's mpirun ends with status 0 after losing a host mid-run: hvdtrun, which holds a
    connection from every rank until the rank's process ends, finds the third host's rank still
    open and fails the job, naming it."""
    hosts = ",".join(f"{host.address}:1" for host in netns_cluster.hosts)
    status, output = hvdtrun_losing_a_host(netns_cluster, tmp_path, PLAIN_SCRIPT, ["-np", "3", "-H", hosts],
                                           steps_before=5)
    assert status == 75, output  # hvdtrain's status for a rank's lost peer (core/exits.py)
    assert (f"hvdtrun: mpirun ended with status 0, but rank 2 (from {netns_cluster.hosts[2].address}) had not "
            f"ended") in output, output
