"""A rank that fails on a remote host ends the whole job with an error, instead of a hang."""

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
