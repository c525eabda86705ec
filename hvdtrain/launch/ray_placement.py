"""Workers placed on a Ray cluster, each an actor holding the relay of one rank (relay.py).

Ray holds every worker's resources with a placement group, packed per host as Horovod placed
them: `num_workers` bundles of one worker packed onto as few hosts as fit, or `num_hosts`
bundles of `workers_per_host` workers on as many different hosts. Used by hvdtrain.ray's
RayExecutor and by `hvdtrain` with cluster.launcher=ray, where mpirun starts the ranks through
the actors.
"""

import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hvdtrain.launch.relay import RankRelay, RankSeat, host_by_host, relayed
from hvdtrain.run.config import ConfigError

# Of a node's own resource (`node:ADDRESS`, 1 on each node) that a worker asks for: what puts it
# on that node, however many workers share it.
NODE_SHARE = 0.001


@ray.remote
class RankActor:
    """One worker: holds its rank's relay on the node Ray placed it on."""

    def __init__(self, key: bytes):
        self.relay = RankRelay(ray.util.get_node_ip_address(), key)

    def seat(self):
        return (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), self.relay.address,
                [str(gpu) for gpu in ray.get_gpu_ids()])

    def expect(self, rank: int, environment: Dict[str, str]):
        self.relay.expect(rank, environment)

    def start_executable(self, cls, args, kwargs, timeout_s: float):
        self.relay.call("start", (cls, args, kwargs), timeout_s)

    def execute(self, fn, timeout_s: Optional[float] = None, logged=None):
        """fn's result on the rank; what the rank logs meanwhile goes into the `logged` queue
        (a ray.util.queue.Queue), for the driver's callbacks."""
        return self.relay.call("execute", fn, timeout_s, on_sent=logged.put if logged is not None else None)

    def close(self):
        self.relay.close()


@dataclass
class Placement:
    """Placed workers in rank order (host by host, hosts in the order Ray gave their first
    worker, as mpirun numbers ranks), with where each sits and what its rank should inherit."""
    group: Any
    owned: bool  # made for these workers (and removed with them), not the caller's own
    workers: List[Any] = field(default_factory=list)
    seats: List[RankSeat] = field(default_factory=list)
    environments: List[Dict[str, str]] = field(default_factory=list)

    def close(self):
        """Give back the workers (their relays stop what they started) and their resources."""
        for worker in self.workers:
            ray.kill(worker)
        if self.owned:
            remove_placement_group(self.group)


def place(key: bytes, timeout_s: float, cpus_per_worker: int = 1, gpus_per_worker: int = 0,
          num_workers: Optional[int] = None, num_hosts: Optional[int] = None, workers_per_host: int = 1,
          group=None, environment: Optional[Dict[str, str]] = None,
          on_nodes: Optional[Sequence[Tuple[str, int]]] = None) -> Placement:
    """Workers for `num_workers` ranks packed (PACK), for `num_hosts` hosts of
    `workers_per_host` (STRICT_SPREAD), or `on_nodes`: (a Ray node's address, workers) pairs, each
    node's workers on it (by the node's own resource, `node:ADDRESS`); TimeoutError naming what
    was asked and what the cluster has where Ray cannot place them within `timeout_s`. Workers on
    a node that died before they answered are placed again within the same time. `num_workers`
    workers go into `group`, a placement group of the caller's (a Ray Tune trial's), where one is
    given.

    Every rank of a node sees the GPUs Ray gave all the node's workers (CUDA_VISIBLE_DEVICES, in
    rank order), so that a rank takes its GPU by its local rank, as Horovod's Ray workers did;
    `environment` (the user's variables) comes on top."""
    worker = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
    if on_nodes is not None:
        bundles = [{**worker, f"node:{address}": NODE_SHARE} for address, count in on_nodes for _ in range(count)]
        strategy, per_bundle = "PACK", 1
        asked = " and ".join(f"{count} workers of {worker} on node {address}" for address, count in on_nodes)
    elif num_hosts is None:
        bundles, strategy, per_bundle = [worker] * num_workers, "PACK", 1
        asked = f"{num_workers} workers of {worker}"
    else:
        host = {name: amount * workers_per_host for name, amount in worker.items()}
        bundles, strategy, per_bundle = [host] * num_hosts, "STRICT_SPREAD", workers_per_host
        asked = f"{num_hosts} hosts of {host} ({workers_per_host} worker{'s' * (workers_per_host > 1)} each)"
    deadline = time.monotonic() + timeout_s
    given = group
    while True:
        group = given or placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([group.ready()], timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            if given is None:
                remove_placement_group(group)
            nodes = sum(node["Alive"] for node in ray.nodes())
            raise TimeoutError(f"Ray could not place {asked} within {timeout_s:g} s: the cluster has {nodes} "
                               f"node{'s' * (nodes != 1)} with {_shown(ray.cluster_resources())}, of which "
                               f"{_shown(ray.available_resources())} are free")
        workers = [RankActor.options(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(
                                         group, placement_group_bundle_index=-1 if given else index // per_bundle)
                                     ).remote(key)
                   for index in range(len(bundles) * per_bundle)]
        placement = Placement(group, given is None, workers)
        try:
            seats = ray.get([worker.seat.remote() for worker in workers],
                            timeout=max(1.0, deadline - time.monotonic()))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            placement.close()  # a node that died and Ray did not know yet: place again
            if time.monotonic() >= deadline:
                raise TimeoutError(f"Ray placed {asked}, but not all of them started within {timeout_s:g} s") from None
            continue
        order = host_by_host([node for node, *_ in seats])
        node_gpus: Dict[str, List[str]] = {}
        for index in order:
            node_gpus.setdefault(seats[index][0], []).extend(seats[index][3])
        placement.workers = [workers[index] for index in order]
        placement.seats = [RankSeat(seats[index][1], seats[index][2]) for index in order]
        placement.environments = [{**({"CUDA_VISIBLE_DEVICES": ",".join(node_gpus[seats[index][0]])}
                                       if node_gpus[seats[index][0]] else {}), **(environment or {})}
                                  for index in order]
        ray.get([worker.expect.remote(rank, environment) for rank, (worker, environment)
                 in enumerate(zip(placement.workers, placement.environments, strict=True))])
        return placement


def _answers(address, timeout_s=10.0):
    """OSError unless the Ray cluster at HOST:PORT accepts a connection within `timeout_s`: Ray
    itself keeps trying an address where nothing answers for minutes. Other forms are Ray's to read."""
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()


def _shown(resources):
    """CPUs, GPUs and custom resources; not memory, nor the per-node and placement-group entries."""
    shown = {name: amount for name, amount in resources.items()
             if name not in ("memory", "object_store_memory") and not name.startswith(("node:", "accelerator_type:"))
             and "_group_" not in name}
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in sorted(shown.items())) + "}"


class RayHosts:
    """The hosts of an `hvdtrain` run with cluster.launcher=ray: `cluster.num_hosts` hosts of
    `cluster.slots` workers placed on the Ray cluster at cluster.ray.address, and placed anew
    before each restart (Ray moves the workers of a node that died to one that lives). mpirun
    reaches them through the workers' relays."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._key = secrets.token_bytes(32)
        self.placement: Optional[Placement] = None
        address = cluster.ray.address
        try:
            _answers(os.environ.get("RAY_ADDRESS", "") if address == "auto" else address)
            ray.init(address=address, logging_level="WARNING", configure_logging=False)
        except (ConnectionError, OSError, RuntimeError, ValueError) as error:
            raise ConfigError(f"cluster.ray.address={address}: no Ray cluster answers there "
                              f"({str(error).strip().splitlines()[0]})") from None
        self.place()

    def place(self):
        """Place the hosts' workers, giving back those placed before."""
        if self.placement is not None:
            self.placement.close()
            self.placement = None
        ray_config = self.cluster.ray
        try:
            self.placement = place(self._key, ray_config.placement_timeout_s, ray_config.cpus_per_worker,
                                   ray_config.gpus_per_worker, num_hosts=self.cluster.num_hosts,
                                   workers_per_host=self.cluster.slots)
        except TimeoutError as error:
            raise ConfigError(f"cluster={self.cluster.name}: {error} (cluster.ray.placement_timeout_s)") from None

    def mpirun_hosts(self, env: Dict[str, str]):
        """The hosts and the mpirun arguments that reach them; `env` gets what the agent needs."""
        return relayed(self.placement.seats, self._key, env)

    def close(self):
        if self.placement is not None:
            self.placement.close()
            self.placement = None
        ray.shutdown()
