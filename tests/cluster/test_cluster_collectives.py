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
