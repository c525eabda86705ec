"""Who is who: the ranks of this job, the hosts they share, and the communicators the engine owns."""

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    is_homogeneous: bool
    hosts: Tuple[str, ...]  # the host of every rank, indexed by rank


def discover(comm):
    """Find the topology of `comm` (an mpi4py communicator) and return it with the
    communicators the engine uses: a private duplicate of `comm` (so that user traffic on
    `comm` can never match ours), the ranks on this host, and one rank per host."""
    from mpi4py import MPI

    world = comm.Dup()
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    cross = world.Split(color=local.Get_rank(), key=world.Get_rank())
    local_sizes = world.allgather(local.Get_size())
    hosts = tuple(world.allgather(MPI.Get_processor_name()))
    topology = Topology(
        rank=world.Get_rank(),
        size=world.Get_size(),
        local_rank=local.Get_rank(),
        local_size=local.Get_size(),
        cross_rank=cross.Get_rank(),
        cross_size=cross.Get_size(),
        is_homogeneous=len(set(local_sizes)) == 1,
        hosts=hosts,
    )
    return topology, world, local, cross
