"""The `cluster` section: how many hosts and ranks (the layout), where they are, what starts the
ranks, and the links between them that the plan predicts scaling with."""

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING

RANK_LAUNCHERS = ("mpirun", "srun", "ray")  # cluster.launcher: what starts the ranks

# What one step of a ring costs over a network, in NCCL's own performance model: NCCL 2.5.6,
# src/graph/tuning.cc, hwLat[NET][Ring][Simple] = 6.6 us (Simple: the protocol of large buffers).
NETWORK_STEP_LATENCY_US = 6.6


@dataclass
class NetworkConfig:
    """The links the plan predicts scaling with (hvdtrain/scaling/step_time.py)."""
    gbps: Optional[float] = None  # between hosts, Gbit/s; null: unknown
    latency_us: Optional[float] = NETWORK_STEP_LATENCY_US  # between hosts, per ring step; null: unknown
    # Between the ranks of one host; null: the device's usual link (step_time.WITHIN_HOST: PCIe 3.0
    # x16 for GPUs, shared memory for CPU ranks).
    within_gbps: Optional[float] = None
    within_latency_us: Optional[float] = None


@dataclass
class RayConfig:
    """cluster.launcher=ray: Ray places the hosts' workers (hvdtrain/launch/ray_placement.py)."""
    address: str = "auto"  # the cluster's, as ray.init takes it: auto finds the one this machine is in
    cpus_per_worker: int = 1
    gpus_per_worker: int = 0
    placement_timeout_s: float = 100.0  # for Ray to find the resources, at the start and at each restart


@dataclass
class ClusterConfig:
    name: str = MISSING
    num_hosts: int = 1
    slots: int = 1  # ranks per host
    hosts: List[str] = field(default_factory=list)  # "name" or "name:slots" (hvdtrain/run/hosts.py)
    hostfile: Optional[str] = None
    mpirun_args: List[str] = field(default_factory=list)
    # What starts the ranks: mpirun (inside a Slurm allocation, Open MPI starts its daemons with
    # Slurm's own launcher), srun, which starts every rank as a task of a Slurm job step, or ray:
    # mpirun on hosts that a Ray cluster chooses, its daemons started through Ray's workers.
    launcher: str = "mpirun"
    ray: RayConfig = field(default_factory=RayConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)


def check(cfg, problems):
    cluster = cfg.cluster
    problems.check(cluster.num_hosts >= 1, "cluster.num_hosts", "must be at least 1")
    problems.check(cluster.slots >= 1, "cluster.slots", "must be at least 1 rank per host")
    network = cluster.network
    for key in ("gbps", "within_gbps"):
        problems.check(network[key] is None or network[key] > 0, f"cluster.network.{key}",
                       "must be a positive Gbit/s or null")
    for key in ("latency_us", "within_latency_us"):
        problems.check(network[key] is None or network[key] >= 0, f"cluster.network.{key}",
                       "must be microseconds (0 or more) or null")
    problems.check(cluster.launcher in RANK_LAUNCHERS, "cluster.launcher", f"allowed: {', '.join(RANK_LAUNCHERS)}")
    if cluster.launcher == "ray":
        problems.check(not cluster.hosts and not cluster.hostfile, "cluster.hosts",
                       "cluster.launcher=ray: Ray chooses the hosts; give none")
        problems.check(cluster.ray.cpus_per_worker >= 1, "cluster.ray.cpus_per_worker", "must be at least 1")
        problems.check(cluster.ray.gpus_per_worker >= 0, "cluster.ray.gpus_per_worker", "must be 0 or more")
        problems.check(cluster.ray.placement_timeout_s > 0, "cluster.ray.placement_timeout_s", "must be positive")
