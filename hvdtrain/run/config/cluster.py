"""The `cluster` section: how many hosts and ranks (the layout), where they are, what starts the
ranks, and the links between them that the plan predicts scaling with."""

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING

RANK_LAUNCHERS = ("mpirun", "srun")  # cluster.launcher: what starts the ranks

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
class ClusterConfig:
    name: str = MISSING
    num_hosts: int = 1
    slots: int = 1  # ranks per host
    hosts: List[str] = field(default_factory=list)  # "name" or "name:slots" (hvdtrain/run/hosts.py)
    hostfile: Optional[str] = None
    mpirun_args: List[str] = field(default_factory=list)
    # What starts the ranks: mpirun (inside a Slurm allocation, Open MPI starts its daemons with
    # Slurm's own launcher), or srun, which starts every rank as a task of a Slurm job step
    launcher: str = "mpirun"
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
