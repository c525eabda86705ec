"""What hvdtrain tells Open MPI through the environment before MPI starts in a rank (MCA
parameters are read once, by MPI_Init). Every setting yields to one the user made."""

import os
from pathlib import Path

ALLREDUCE_RULES = Path(__file__).with_name("openmpi_allreduce_rules.txt")
# Any of these set by the user means they choose Open MPI's allreduce algorithm themselves.
_USER_ALGORITHM_CHOICE = ("OMPI_MCA_coll_tuned_use_dynamic_rules", "OMPI_MCA_coll_tuned_dynamic_rules_filename",
                          "OMPI_MCA_coll_tuned_allreduce_algorithm")


def tune_environment(env=os.environ):
    # The engine thread shares cores with the training threads: Open MPI must not spin while
    # it waits (see hvdtrain/launch/mpirun.py, which sets it for the jobs it starts).
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if not spans_hosts(env):
        return
    if not any(name in env for name in _USER_ALGORITHM_CHOICE):
        env["OMPI_MCA_coll_tuned_use_dynamic_rules"] = "1"
        env["OMPI_MCA_coll_tuned_dynamic_rules_filename"] = str(ALLREDUCE_RULES)
    # Two TCP connections to each peer instead of one. Between two hosts, where the ring sends
    # and receives the same piece at once over one connection, Open MPI's TCP transport
    # moved 1 MiB pieces at 0.55 of a tc-shaped 1 Gbit/s link in most jobs and at 0.95 in
    # the others (raw TCP, sending and receiving at once: always 0.95); with two connections,
    # 0.78-0.95 in every job, and no change on 3 or 4 hosts (docs/scaling_model.md).
    env.setdefault("OMPI_MCA_btl_tcp_links", "2")


def spans_hosts(env):
    """Whether this rank's job has ranks on other hosts, as its launcher says: Open MPI's mpirun
    gives each rank the job's size and its host's share of it, Slurm's srun the step's nodes."""
    world, local = env.get("OMPI_COMM_WORLD_SIZE"), env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if world and local:
        return int(world) > int(local)
    return int(env.get("SLURM_STEP_NUM_NODES") or 1) > 1
