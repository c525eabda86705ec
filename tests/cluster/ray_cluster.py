"""A real Ray cluster on this one machine, for tests that run hvdtrain.ray as a Ray user does.

`ray_cluster(netns, work_dir)` starts it and stops all of it when its block ends, also on an error:

- The head (`ray start --head`, no CPUs of its own, so that no worker is placed on it) in the root
  namespace at the bridge's address: the test process, also in the root namespace, is the driver
  and connects to it, as a driver on a cluster's head node does.
- One worker node per network-namespace host of netns_cluster.py, at the host's address, each in a
  UTS namespace of its own named after the host's namespace, so that `socket.gethostname()` tells
  the hosts apart as on real machines; each offers CPUS_PER_NODE CPUs.
- No token authentication (which `ray start --head` now turns on by default): Ray reads the
  driver's auth settings once per process, when it is first imported, and the test process may
  have imported it before; the cluster is reached only through its own bridge.
"""

import collections
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Tuple

from netns_cluster import free_port, kill_daemon, start_daemon

CPUS_PER_NODE = 2
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class RayCluster:
    address: str  # the head's GCS address, for ray.init(address=...)
    nodes: Tuple[Tuple[str, str], ...]  # (hostname, address) of each worker node
    processes: List[subprocess.Popen]  # each `ray start --block`: the head's, each node's, and nodes' started again
    start_node: Callable[[int], None]  # starts the node of host INDEX again, after its processes were killed


def missing_requirements():
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'hvdtrain[ray]')"
    return None


@contextlib.contextmanager
def ray_cluster(netns, work_dir: Path):
    """The cluster, its logs in `work_dir`."""
    ray = str(Path(sys.executable).with_name("ray"))
    # Ray's session directories hold Unix sockets, whose paths may not pass 107 bytes: pytest's
    # temporary directories are too deep for them.
    sessions = Path(tempfile.mkdtemp(prefix="hvtray"))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    head_address = netns.subnet.replace(".0/24", ".1")
    address = f"{head_address}:{free_port(head_address)}"
    processes = []
    try:
        processes.append(start_daemon([ray, "start", "--block", "--head", f"--node-ip-address={head_address}",
                                       f"--port={address.rpartition(':')[2]}", "--num-cpus=0",
                                       "--include-dashboard=false", f"--temp-dir={sessions / 'head'}"],
                                      env, work_dir / "head.log"))
        starts = collections.Counter()

        def start_node(index):
            host, starts[index] = netns.hosts[index], starts[index] + 1
            processes.append(start_daemon(host.with_own_hostname(
                [ray, "start", "--block", f"--address={address}", f"--node-ip-address={host.address}",
                 f"--num-cpus={CPUS_PER_NODE}", f"--temp-dir={sessions / f'node{index}-{starts[index]}'}"]),
                env, work_dir / f"node{index}-{starts[index]}.log"))

        for index in range(len(netns.hosts)):
            start_node(index)
        cluster = RayCluster(address, tuple((host.namespace, host.address) for host in netns.hosts), processes,
                             start_node)
        _wait_for_nodes(cluster, len(netns.hosts), work_dir)
        yield cluster
    finally:
        # The nodes go at once, as machines switched off (Ray's own stop takes 20 s a node).
        for process in processes:
            kill_daemon(process)
        shutil.rmtree(sessions, ignore_errors=True)


def _wait_for_nodes(cluster, count, work_dir):
    """Until the head sees `count` worker nodes alive; RuntimeError naming the logs as soon as a
    node's process ends, or after START_TIMEOUT_S (ray.init itself would wait minutes for a
    head that is not up)."""
    import ray

    deadline = time.monotonic() + START_TIMEOUT_S

    def check():
        if any(process.poll() is not None for process in cluster.processes) or time.monotonic() > deadline:
            raise RuntimeError(f"the Ray cluster did not start within {START_TIMEOUT_S} s; logs: {work_dir}")
        time.sleep(0.5)

    host, _, port = cluster.address.rpartition(":")
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            break
        except OSError:
            check()
    ray.init(address=cluster.address)
    try:
        while sum(node["Alive"] and node["Resources"].get("CPU", 0) > 0 for node in ray.nodes()) < count:
            check()
    finally:
        ray.shutdown()
