"""Ranks on several hosts know where they run: rank, local and cross rank follow the hosts."""

import json
import os

import pytest


def ranks_topology(expected_json):
    from hvdtrain import core

    expected = json.loads(expected_json)
    hosts = expected["hosts"]  # the host each rank should run on, by rank
    core.init()
    topology = core.topology()
    rank = topology.rank
    here = hosts[rank]
    assert os.stat("/proc/self/ns/net").st_ino == expected["netns"][here], f"rank {rank} is not on {here}"
    assert topology.size == len(hosts), (rank, topology)
    assert topology.hosts == tuple(hosts), (rank, topology)
    neighbours = [r for r, host in enumerate(hosts) if host == here]
    assert (topology.local_rank, topology.local_size) == (neighbours.index(rank), len(neighbours)), \
        (rank, topology)
    # The cross communicator of local rank k holds one rank per host that has a k-th rank.
    hosts_in_order = list(dict.fromkeys(hosts))
    peers = [host for host in hosts_in_order if hosts.count(host) > topology.local_rank]
    assert (topology.cross_rank, topology.cross_size) == (peers.index(here), len(peers)), (rank, topology)
    assert topology.is_homogeneous == expected["homogeneous"], (rank, topology)
    horovod_api = (core.rank(), core.size(), core.local_rank(), core.local_size(), core.cross_rank(),
                   core.cross_size(), core.is_homogeneous())
    assert horovod_api == (topology.rank, topology.size, topology.local_rank, topology.local_size,
                           topology.cross_rank, topology.cross_size, topology.is_homogeneous), (rank, horovod_api)


@pytest.mark.parametrize("slots, homogeneous", [((2, 2), True), ((2, 1), False), ((1, 1, 1), True)],
                         ids=["2x2", "2+1", "3x1"])
def test_topology_follows_the_hosts(netns_cluster, cluster_mpirun, slots, homogeneous):
    hosts = [host.namespace for host, count in zip(netns_cluster.hosts, slots) for _ in range(count)]
    netns = {host.namespace: host.netns_inode() for host in netns_cluster.hosts}
    expected = {"hosts": hosts, "netns": netns, "homogeneous": homogeneous}
    cluster_mpirun(slots, ranks_topology, json.dumps(expected))
