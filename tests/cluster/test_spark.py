"""hvdtrain.spark.run on a Spark standalone cluster whose workers are network-namespace hosts
(spark_cluster.py): the driver's mpirun reaches every host through its tasks, and the ranks run
where Spark ran the tasks, with exact collectives between the hosts."""

import socket
import sys

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hvdtrain[spark]')")

import hvdtrain.spark  # noqa: E402
from hvdtrain.spark import RankFailed  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the executors cannot import this module


def ranks_summary():
    from hvdtrain import core

    core.init()
    summed = core.allreduce_async(np.arange(1 << 16, dtype=np.int64) * (core.rank() + 1), name="sum",
                                  op=core.ReduceOp.SUM).wait()
    return dict(host=socket.gethostname(), rank=core.rank(), size=core.size(), local_rank=core.local_rank(),
                cross_rank=core.cross_rank(), cross_size=core.cross_size(), summed=summed)


@pytest.fixture(scope="module")
def summaries(spark_session):
    return hvdtrain.spark.run(ranks_summary, num_proc=4)


def test_ranks_run_on_the_hosts_of_their_tasks_host_by_host(spark_session, summaries):
    cluster, _ = spark_session
    hosts = [s["host"] for s in summaries]
    assert [s["rank"] for s in summaries] == [0, 1, 2, 3]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    assert set(hosts) == {name for name, _ in cluster.workers}
    assert [(s["local_rank"], s["cross_rank"], s["cross_size"]) for s in summaries] == \
        [(0, 0, 2), (1, 0, 2), (0, 1, 2), (1, 1, 2)]


def test_collectives_between_the_hosts_are_exact(summaries):
    expected = np.arange(1 << 16, dtype=np.int64) * (1 + 2 + 3 + 4)
    for summary in summaries:
        np.testing.assert_array_equal(summary["summed"], expected, err_msg=f"rank {summary['rank']}")


def fails_on_the_second_host():
    from hvdtrain import core

    core.init()
    core.allreduce_async(np.ones(4), name="every host is up", op=core.ReduceOp.SUM).wait()
    if core.cross_rank() == 1 and core.local_rank() == 0:
        raise ValueError(f"rank {core.rank()} on {socket.gethostname()} refuses on purpose")
    return core.rank()


def test_a_rank_that_raises_on_another_host_fails_the_call_naming_it(spark_session):
    with pytest.raises(RankFailed, match=r"rank 2 \(\S+\) failed: ValueError: rank 2 on hvt\w+ refuses on purpose"):
        hvdtrain.spark.run(fails_on_the_second_host, num_proc=4)
