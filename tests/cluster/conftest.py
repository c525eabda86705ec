"""Several hosts on this one machine, so that tests run hvdtrain across hosts for real.

The hosts are network namespaces, made as netns_cluster.py makes them, once per test session by
the `netns_cluster` fixture and removed at the session's end, also when tests fail. The directory
they do not share is this session's pytest temporary directory: every host but the first sees it
empty, so that a run that needs a file written on another host fails.
"""

import sys
from pathlib import Path

import pytest

from hvdtrain.run.hosts import Host
from netns_cluster import AGENT, missing_requirements, netns_cluster as make_netns_cluster
from ray_cluster import missing_requirements as missing_ray_requirements, ray_cluster as make_ray_cluster
from slurm_cluster import missing_requirements as missing_slurm_requirements, slurm_cluster
from spark_cluster import missing_requirements as missing_spark_requirements, spark_cluster as make_spark_cluster

HOST_COUNT = 3


def private_directory(tmp_path_factory):
    """The directory the hosts do not share: this session's pytest temporary directory. What every
    host runs (the repository, the virtual environment) must lie outside it."""
    private = tmp_path_factory.getbasetemp().resolve()
    needed = {"the repository": AGENT.parent.parent.parent, "the Python environment": Path(sys.prefix).resolve()}
    for what, path in needed.items():
        if path == private or private in path.parents:
            raise RuntimeError(f"{what} ({path}) lies in pytest's temporary directory {private}, which the cluster "
                               f"tests hide from all hosts but one: give pytest another --basetemp")
    return private


@pytest.fixture(scope="session")
def netns_cluster(tmp_path_factory):
    missing = missing_requirements()
    if missing:
        pytest.skip(f"the cluster tests are skipped: {missing}")
    with make_netns_cluster(HOST_COUNT, private_directory(tmp_path_factory)) as cluster:
        yield cluster


@pytest.fixture
def cluster_mpirun(netns_cluster, mpirun):
    """Run a test function on `slots[i]` ranks on host i of the cluster (ranks are numbered
    host by host); all hosts share this machine's cores."""

    def run(slots, function, *args, **options):
        hosts = [Host(host.address, count) for host, count in zip(netns_cluster.hosts, slots)]
        return mpirun(sum(slots), function, *args, hosts=hosts, extra_args=netns_cluster.mpirun_args(), **options)

    return run


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real Slurm cluster of 2 nodes (slurm_cluster.py), made once for the session's Slurm tests."""
    missing = missing_slurm_requirements()
    if missing:
        pytest.skip(f"the Slurm cluster tests are skipped: {missing}")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ray_cluster(netns_cluster, tmp_path_factory):
    """A Ray cluster (ray_cluster.py) on the hosts, this process its driver, for one test module."""
    missing = missing_ray_requirements()
    if missing:
        pytest.skip(f"the Ray cluster tests are skipped: {missing}")
    import ray

    with make_ray_cluster(netns_cluster, tmp_path_factory.mktemp("ray")) as cluster:
        ray.init(address=cluster.address)
        try:
            yield cluster
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def spark_session(netns_cluster, tmp_path_factory):
    """A Spark standalone cluster (spark_cluster.py) of 2 workers on the hosts, and this process
    its driver, for one test module."""
    missing = missing_spark_requirements()
    if missing:
        pytest.skip(f"the Spark cluster tests are skipped: {missing}")
    from pyspark.sql import SparkSession

    with make_spark_cluster(netns_cluster, tmp_path_factory.mktemp("spark")) as cluster, \
            pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        session = (SparkSession.builder.master(cluster.master).appName("hvdtrain-spark-cluster-tests")
                   .config("spark.driver.host", cluster.driver_host)
                   .config("spark.driver.bindAddress", cluster.driver_host)
                   .config("spark.ui.enabled", "false").getOrCreate())
        try:
            yield cluster, session
        finally:
            session.stop()
