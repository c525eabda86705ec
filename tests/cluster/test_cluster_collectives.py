"""Collectives between ranks on different hosts give exact results, over TCP between the hosts."""

import numpy as np

MIB = 1 << 20
ELEMENTS = MIB  # 4 MiB per allreduce in 32-bit types: large enough to be cut into pieces on the wire
BROADCAST_ROOT = 3  # on the second host of a 2x2 layout


def ranks_collectives():
    from hvdtrain import core

    core.init()
    rank, size = core.rank(), core.size()
    # Integers below 2**24, so that float32 sums are exact in any order; 4 ranks make the mean exact.
    contribution = np.arange(ELEMENTS) * (rank + 1)
    factor = size * (size + 1) // 2
    summed = core.allreduce_async(contribution.astype(np.int32), name="sum", op=core.ReduceOp.SUM).wait()
    np.testing.assert_array_equal(summed, np.arange(ELEMENTS, dtype=np.int32) * factor, err_msg=f"rank {rank}")
    averaged = core.allreduce_async(contribution.astype(np.float32), name="mean", op=core.ReduceOp.AVERAGE).wait()
    np.testing.assert_array_equal(averaged, np.arange(ELEMENTS, dtype=np.float32) * factor / size,
                                  err_msg=f"rank {rank}")

    rows = np.full((rank + 1, 3), rank, np.int64)  # ragged: rank r gives r + 1 rows
    gathered = core.allgather_async(rows, name="ragged").wait()
    expected_rows = np.repeat(np.arange(size), np.arange(1, size + 1))
    np.testing.assert_array_equal(gathered, np.repeat(expected_rows[:, None], 3, axis=1), err_msg=f"rank {rank}")

    sent = np.random.default_rng(BROADCAST_ROOT).standard_normal(MIB // 8)
    received = sent.copy() if rank == BROADCAST_ROOT else np.zeros_like(sent)
    core.broadcast_async(received, BROADCAST_ROOT, name="from_second_host").wait()
    np.testing.assert_array_equal(received, sent, err_msg=f"rank {rank}")


def test_collectives_across_hosts_are_exact(netns_cluster, cluster_mpirun):
    second_host = netns_cluster.hosts[1]
    received_before, sent_before = second_host.traffic_bytes()
    cluster_mpirun((2, 2), ranks_collectives)
    received_after, sent_after = second_host.traffic_bytes()
    # Each allreduce result on one host depends on all 4 MiB of the other host's contributions,
    # so at least that much must cross the link both ways, twice.
    assert received_after - received_before >= 2 * 4 * MIB
    assert sent_after - sent_before >= 2 * 4 * MIB


RING_ELEMENTS = 4 * MIB  # 16 MiB of float32: 16 of the engine's 1 MiB pieces


def ranks_large_allreduce():
    from hvdtrain import core

    core.init()
    ones = np.ones(RING_ELEMENTS, np.float32)
    summed = core.allreduce_async(ones, name="large", op=core.ReduceOp.SUM).wait()
    np.testing.assert_array_equal(summed, np.full(RING_ELEMENTS, core.size(), np.float32), err_msg=f"rank {core.rank()}")


def test_across_hosts_each_host_sends_what_a_ring_sends(netns_cluster, cluster_mpirun):
    """Across hosts the engine's pieces are reduced by Open MPI's ring (hvdtrain/core/openmpi.py):
    each of 3 hosts sends 2(N-1)/N = 4/3 of the buffer. Open MPI's own choice for 1 MiB pieces,
    recursive doubling, has the first host send the whole buffer twice."""
    hosts = netns_cluster.hosts[:3]
    before = [host.traffic_bytes()[1] for host in hosts]
    cluster_mpirun((1, 1, 1), ranks_large_allreduce)
    sent = [host.traffic_bytes()[1] - start for host, start in zip(hosts, before)]
    buffer_bytes = RING_ELEMENTS * 4
    # Above 4/3: the headers of TCP, IP and Ethernet, and the job's start and coordination.
    assert all(4 / 3 * buffer_bytes <= each <= 1.5 * buffer_bytes for each in sent), \
        [round(each / buffer_bytes, 3) for each in sent]
