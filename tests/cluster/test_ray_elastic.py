"""hvdtrain.ray's elastic RayExecutor (min_workers) on a Ray cluster whose worker nodes are
network-namespace hosts (ray_cluster.py): a Horovod Elastic function runs on as many workers as
Ray's nodes hold; when a node is lost it goes on, from its last commit, on the nodes left, and
when a node joins, on all of them from its next commit."""

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import ray

from hvdtrain.ray import RayExecutor
from support import elastic_functions
from support.elastic_functions import counts_steps, refuses_on_rank_1, when_steps_done

# The workers cannot import the elastic functions' module, nor this one: their functions travel by
# value, as those of a driver's own script (__main__) do.
ray.cloudpickle.register_pickle_by_value(elastic_functions)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_an_elastic_run_takes_the_workers_the_nodes_hold_up_to_max_workers(ray_cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=1, max_workers=2, cpus_per_worker=2)
    executor.start()
    try:
        results = executor.run(counts_steps, args=(5,))
    finally:
        executor.shutdown()
    assert results == [(0, 2, 5, [2], True), (1, 2, 5, [2], True)]


def test_an_error_of_the_function_ends_the_elastic_run_without_a_restart(ray_cluster, capfd):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=2, cpus_per_worker=2)
    executor.start()
    try:
        with pytest.raises(RuntimeError, match=r"the elastic job ended with exit status 3: a rank raised an error "
                                               r"that a restart would meet again"):
            executor.run(refuses_on_rank_1)
    finally:
        executor.shutdown()
    output = capfd.readouterr().err
    assert "ValueError: rank 1 refuses on purpose" in output and "starting it again" not in output, output


class NodesOfTheTest:
    """A discovery of the caller's own (override_discovery=False), as Horovod's HostDiscovery."""

    def __init__(self, addresses):
        self.addresses = addresses

    def find_available_hosts_and_slots(self):
        return {address: 1 for address in self.addresses}


def hostname_in_an_elastic_run():
    import socket

    import hvdtrain.torch as hvd

    hvd.init()

    @hvd.elastic.run
    def train(state):
        state.commit()
        return socket.gethostname()

    return train(hvd.elastic.ObjectState(step=0))


def test_a_discovery_of_the_callers_own_places_the_workers_on_its_hosts(ray_cluster):
    chosen = ray_cluster.nodes[1:]  # (hostname, address): 2 of the 3 nodes, not the first
    settings = RayExecutor.create_settings(timeout_s=60)
    settings.discovery = NodesOfTheTest([address for _, address in chosen])
    executor = RayExecutor(settings, min_workers=2, cpus_per_worker=2, override_discovery=False)
    executor.start()
    try:
        hostnames = executor.run(hostname_in_an_elastic_run)
    finally:
        executor.shutdown()
    assert sorted(hostnames) == sorted(name for name, _ in chosen)


def test_an_elastic_run_goes_on_from_its_last_commit_when_a_node_is_lost(netns_cluster, ray_cluster):
    """A worker on each of the 3 nodes; once rank 0 has done 5 steps, all processes of the third
    node are killed (a machine that goes down). The job fails, hvdtrain.ray looks for hosts again
    (Ray may still count the node alive for a while: the workers it cannot place count as one
    more failed start) and starts the function on the 2 nodes left, which goes on from its last
    commit. The run's callbacks get what rank 0 logged in both starts."""
    logged = []
    results = run_changing_the_nodes(40, netns_cluster.hosts[2].kill_processes, callbacks=[logged.append])
    assert [result[:3] for result in results] == [(0, 2, 40), (1, 2, 40)], results
    assert all(result[3:] == ([3, 2], True) for result in results), results
    sizes = [size for _, size in logged]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 3 and sizes[-1] == 2, logged
    assert sorted({step for step, _ in logged}) == list(range(1, 41)), logged


def test_an_elastic_run_grows_from_its_next_commit_when_a_node_joins(netns_cluster, ray_cluster):
    """The third node is down (killed, and Ray has seen it go) as the function starts on the 2
    others; once rank 0 has done 5 steps the node starts again: the ranks end the job at their
    next commit, and hvdtrain.ray starts the function on 3 workers, which goes on from there."""
    netns_cluster.hosts[2].kill_processes()
    deadline = time.monotonic() + 120
    while sum(node["Alive"] and node["Resources"].get("CPU", 0) > 0 for node in ray.nodes()) > 2:
        assert time.monotonic() < deadline, "Ray still counts the killed node alive after 120 s"
        time.sleep(0.5)
    results = run_changing_the_nodes(150, lambda: ray_cluster.start_node(2))
    assert [result[:3] for result in results] == [(0, 3, 150), (1, 3, 150), (2, 3, 150)], results
    assert all(result[3:] == ([2, 3], True) for result in results), results


def run_changing_the_nodes(steps, change, callbacks=None):
    """The results of counts_steps(steps) on an elastic executor of a worker a node, at least 2,
    where `change()` is called once rank 0 has done 5 steps; with `callbacks`, its rank 0 logs
    (steps done, size) to them at each step."""
    # The progress file where every host sees it (the tests' temporary directory is the first host's alone)
    shared = Path(tempfile.mkdtemp(prefix="hvdtrain-ray-elastic-", dir=Path(__file__).resolve().parent))
    progress = shared / "steps"
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30), min_workers=2,
                           cpus_per_worker=2)

    changer = threading.Thread(target=when_steps_done, args=(progress, 5, change))
    executor.start()
    changer.start()
    try:
        return executor.run(counts_steps, args=(steps, str(progress), 0.2, callbacks is not None),
                            callbacks=callbacks)
    finally:
        changer.join()
        executor.shutdown()
        shutil.rmtree(shared)
