"""A Spark standalone cluster on this one machine, for tests that run hvdtrain.spark as a Spark user does.

`spark_cluster(netns, work_dir)` starts it and stops all of it when its block ends, also on an error:

- The master in the root namespace at the bridge's address; the test process, also in the root
  namespace, is the driver (its address the bridge's too), as on a cluster's gateway machine.
- One worker per network-namespace host of netns_cluster.py (as many as `worker_count`), at the
  host's address, each in a UTS namespace of its own named after the host's namespace, offering
  CORES_PER_WORKER task slots. Its executors run there, with this environment's Python.
"""

import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

from netns_cluster import free_port, kill_daemon, start_daemon

CORES_PER_WORKER = 2
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class SparkCluster:
    master: str  # spark://ADDRESS:PORT
    driver_host: str  # the address the driver binds and is reached at
    workers: Tuple[Tuple[str, str], ...]  # (hostname, address) of each worker


def missing_requirements():
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install 'hvdtrain[spark]')"
    if shutil.which("java") is None:
        return "Spark needs a Java runtime on PATH (Debian: openjdk-17-jre-headless)"
    return None


@contextlib.contextmanager
def spark_cluster(netns, work_dir: Path, worker_count=2):
    import pyspark

    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOG_DIR=str(work_dir))
    address = netns.subnet.replace(".0/24", ".1")
    port = free_port(address)
    processes = []
    try:
        processes.append(start_daemon([spark_class, "org.apache.spark.deploy.master.Master", "--host", address,
                                       "--port", str(port), "--webui-port", str(free_port(address))],
                                      env, work_dir / "master.log"))
        hosts = netns.hosts[:worker_count]
        for index, host in enumerate(hosts):
            processes.append(start_daemon(host.with_own_hostname(
                [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://{address}:{port}",
                 "--host", host.address, "--cores", str(CORES_PER_WORKER), "--memory", "2g",
                 "--work-dir", str(work_dir / f"worker{index}"), "--webui-port", "8081"]),
                # The host's name is its namespace's, which no resolver knows: Spark (the worker
                # and the executors it starts) is told its address.
                dict(env, SPARK_LOCAL_IP=host.address, SPARK_LOCAL_HOSTNAME=host.address),
                work_dir / f"worker{index}.log"))
        cluster = SparkCluster(f"spark://{address}:{port}", address,
                               tuple((host.namespace, host.address) for host in hosts))
        _wait_for_workers(processes, work_dir, worker_count)
        yield cluster
    finally:
        for process in processes:
            kill_daemon(process)


def _wait_for_workers(processes, work_dir, count):
    """Until the master has registered `count` workers (its log says so for each)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while (work_dir / "master.log").read_text().count("Registering worker") < count:
        if any(process.poll() is not None for process in processes) or time.monotonic() > deadline:
            raise RuntimeError(f"the Spark cluster did not start within {START_TIMEOUT_S} s; logs: {work_dir}")
        time.sleep(0.5)
