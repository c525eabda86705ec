"""What hvdtrain tells Open MPI before MPI starts (hvdtrain/core/openmpi.py)."""

import pytest

from hvdtrain.core import openmpi

RULES = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
         "OMPI_MCA_coll_tuned_dynamic_rules_filename": str(openmpi.ALLREDUCE_RULES)}
ACROSS_HOSTS = {**RULES, "OMPI_MCA_btl_tcp_links": "2"}


@pytest.mark.parametrize("launched, ring", [
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, False),
    ({"SLURM_STEP_NUM_NODES": "2"}, True),
    ({"SLURM_STEP_NUM_NODES": "1"}, False),
    ({}, False),
], ids=["mpirun-2-hosts", "mpirun-1-host", "srun-2-nodes", "srun-1-node", "alone"])
def test_the_ring_and_two_connections_a_peer_are_used_only_when_ranks_talk_over_a_network(launched, ring):
    env = dict(launched)
    openmpi.tune_environment(env)
    assert env == {**launched, "OMPI_MCA_mpi_yield_when_idle": "1", **(ACROSS_HOSTS if ring else {})}


@pytest.mark.parametrize("choice", ["OMPI_MCA_coll_tuned_allreduce_algorithm", "OMPI_MCA_coll_tuned_use_dynamic_rules"])
def test_a_users_own_choices_are_kept(choice):
    launched = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", choice: "3",
                "OMPI_MCA_mpi_yield_when_idle": "0", "OMPI_MCA_btl_tcp_links": "1"}
    env = dict(launched)
    openmpi.tune_environment(env)
    assert env == launched


def read_rules(path):
    """The numbers of Open MPI's classic rules file, as its reader takes them ('#' to the end of
    the line is a comment)."""
    numbers = [int(token) for line in path.read_text().splitlines() for token in line.split("#")[0].split()]
    collectives, collective_id, sizes = numbers[:3]
    assert (collectives, collective_id) == (1, 2), "one collective: MPI_Allreduce (id 2)"
    rules, position = [], 3
    for _ in range(sizes):
        communicator_size, message_sizes = numbers[position:position + 2]
        position += 2
        by_size = [tuple(numbers[position + 4 * i:position + 4 * i + 4]) for i in range(message_sizes)]
        position += 4 * message_sizes
        rules.append((communicator_size, by_size))
    assert position == len(numbers), "nothing after the last rule"
    return rules


def test_the_rules_file_gives_the_ring_where_each_of_its_steps_moves_64_kib():
    rules = read_rules(openmpi.ALLREDUCE_RULES)
    communicator_sizes = [size for size, _ in rules]
    assert communicator_sizes == sorted(communicator_sizes) and communicator_sizes[0] == 1
    for size, by_size in rules:
        # Open MPI decides below the threshold (algorithm 0); from it on, the ring (4).
        assert by_size == [(0, 0, 0, 0), (size * 64 * 1024, 4, 0, 0)], size
