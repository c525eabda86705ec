"""hvdtrain.ray.RayExecutor on a Ray cluster whose worker nodes are network-namespace hosts
(ray_cluster.py): Ray places the workers, mpirun starts the ranks through them, and the ranks
run the driver's functions with exact collectives between the hosts."""

import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hvdtrain.ray import RankFailed, RayExecutor

WORKERS_PER_HOST = 2

# The workers cannot import this test module: its functions and classes travel by value, as those
# of a driver's own script (__main__) do.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def settings(**options):
    return RayExecutor.create_settings(timeout_s=60, **options)


def ranks_summary(offset):
    """What a rank sees of the job, and an allreduce whose exact sum says every rank took part."""
    from hvdtrain import core

    core.init()
    summed = core.allreduce_async(np.arange(4, dtype=np.int64) * (core.rank() + offset), name="sum",
                                  op=core.ReduceOp.SUM).wait()
    return dict(host=socket.gethostname(), rank=core.rank(), size=core.size(), local_rank=core.local_rank(),
                local_size=core.local_size(), cross_rank=core.cross_rank(), cross_size=core.cross_size(),
                summed=summed.tolist())


class Counter:
    """An executable_cls: its instance lives in the rank as long as the executor."""

    def __init__(self, start, step=1):
        self.count = start
        self.step = step

    def bump(self):
        self.count += self.step
        return self.count


def rank_of_this_process():
    from hvdtrain import core

    core.init()  # again, where a call before did: as hvd.init(), it changes nothing then
    return core.rank()


def logs_three_values():
    from hvdtrain import core
    from hvdtrain.ray import ray_logger

    core.init()
    for step in range(3):
        ray_logger.log({"rank": core.rank(), "step": step})
    return core.rank()


@pytest.fixture(scope="class")
def two_hosts(ray_cluster):
    """2 hosts of 2 workers, each worker holding a Counter(10, step=5)."""
    executor = RayExecutor(settings(), num_hosts=2, num_workers_per_host=WORKERS_PER_HOST)
    executor.start(executable_cls=Counter, executable_args=[10], executable_kwargs={"step": 5})
    yield executor
    executor.shutdown()


class TestTwoHostsOfTwoWorkers:
    """One executor for these checks; its workers are gone before the next tests place theirs."""

    def test_run_returns_each_rank_result_in_rank_order(self, two_hosts):
        summaries = two_hosts.run(ranks_summary, args=[1])
        assert [s["rank"] for s in summaries] == [0, 1, 2, 3]
        assert all(s["size"] == 4 for s in summaries)
        total = sum(rank + 1 for rank in range(4))
        assert all(s["summed"] == [0, total, 2 * total, 3 * total] for s in summaries)

    def test_local_and_cross_ranks_follow_the_placement(self, two_hosts, ray_cluster):
        summaries = two_hosts.run(ranks_summary, kwargs={"offset": 0})
        hosts = [s["host"] for s in summaries]
        # Packed per host: ranks 0-1 on one host, 2-3 on another, each a worker node of the cluster.
        assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
        assert set(hosts) <= {name for name, _ in ray_cluster.nodes}
        assert [(s["local_rank"], s["local_size"]) for s in summaries] == [(0, 2), (1, 2), (0, 2), (1, 2)]
        assert [(s["cross_rank"], s["cross_size"]) for s in summaries] == [(0, 2), (0, 2), (1, 2), (1, 2)]

    def test_executable_instance_keeps_its_state_across_calls(self, two_hosts):
        assert two_hosts.execute(Counter.bump) == [15] * 4
        assert two_hosts.execute(Counter.bump) == [20] * 4
        assert two_hosts.execute_single(lambda counter: counter.count) == 20

    def test_the_callbacks_get_every_value_the_ranks_log_each_ranks_in_order(self, two_hosts):
        first, second = [], []
        assert two_hosts.run(logs_three_values, callbacks=[first.append, second.append]) == [0, 1, 2, 3]
        assert first == second
        assert sorted(first, key=lambda value: (value["rank"], value["step"])) == \
            [{"rank": rank, "step": step} for rank in range(4) for step in range(3)]
        for rank in range(4):
            assert [value["step"] for value in first if value["rank"] == rank] == [0, 1, 2]

    def test_a_callbacks_error_is_raised_once_the_ranks_have_answered(self, two_hosts):
        def refuses(value):
            raise ValueError(f"the callback refuses {value}")

        with pytest.raises(ValueError, match="the callback refuses"):
            two_hosts.run(logs_three_values, callbacks=[refuses])
        assert two_hosts.run(rank_of_this_process) == [0, 1, 2, 3]

    def test_run_remote_returns_object_refs_in_rank_order(self, two_hosts):
        refs = two_hosts.run_remote(rank_of_this_process)
        assert all(isinstance(ref, ray.ObjectRef) for ref in refs)
        assert ray.get(refs) == [0, 1, 2, 3]


def test_num_workers_are_packed_onto_as_few_hosts_as_fit(ray_cluster):
    executor = RayExecutor(settings(), num_workers=3)
    executor.start()
    try:
        summaries = executor.run(ranks_summary, args=[0])
    finally:
        executor.shutdown()
    hosts = [s["host"] for s in summaries]
    assert len(set(hosts)) == 2 and hosts[0] == hosts[1]  # 2 CPUs a node: 2 workers, then 1
    assert [s["summed"][1] for s in summaries] == [3, 3, 3]


def test_packed_workers_go_into_the_placement_group_they_are_started_in(ray_cluster):
    """As in a Ray Tune trial: the executor, started by a task of a placement group, places its
    workers in that group's bundles (use_current_placement_group) and takes no CPU besides."""
    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_PACK")
    ray.get(group.ready(), timeout=60)
    try:
        in_group = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
        free_outside, ranks = ray.get(trial_in_placement_group.options(scheduling_strategy=in_group).remote(),
                                      timeout=180)
    finally:
        remove_placement_group(group)
    assert ranks == [0, 1]
    assert free_outside == 6 - 2  # the group's 2 CPUs held, none taken by a group of the executor's own


@ray.remote(num_cpus=0)
def trial_in_placement_group():
    executor = RayExecutor(settings(), num_workers=2)
    executor.start()
    try:
        return ray.available_resources().get("CPU", 0), executor.run(rank_of_this_process)
    finally:
        executor.shutdown()


def test_a_gpu_request_is_refused_naming_what_the_cluster_has(ray_cluster):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"hvdtrain.ray: Ray could not place 2 workers of \{'CPU': 1, 'GPU': 1\} "
                                           r"within 3 s: the cluster has 4 nodes with \{CPU: 6\}, "
                                           r"of which \{CPU: 6\} are free "
                                           r"\(placement_group_timeout_s\)"):
        RayExecutor(settings(placement_group_timeout_s=3), num_workers=2, use_gpu=True).start()
    assert time.monotonic() - started < 15


def fails_on_rank_1():
    from hvdtrain import core

    core.init()
    if core.rank() == 1:
        raise ValueError("rank 1 refuses on purpose")
    return core.rank()


def waits_in_collectives():
    from hvdtrain import core

    core.init()
    while True:
        core.allreduce_async(np.ones(4), name="loop", op=core.ReduceOp.SUM).wait()
        time.sleep(0.05)


@pytest.fixture
def executor(ray_cluster):
    executor = RayExecutor(settings(), num_hosts=2, num_workers_per_host=1)
    executor.start()
    yield executor
    executor.shutdown()


def test_an_exception_in_fn_is_raised_on_the_driver_naming_its_rank(executor):
    with pytest.raises(RankFailed, match=r"rank 1 \(\S+\) failed: ValueError: rank 1 refuses on purpose"):
        executor.run(fails_on_rank_1)
    assert executor.run(lambda: 7) == [7, 7]  # the ranks that raised serve on


def test_a_dead_worker_ends_the_call_with_an_error_not_a_hang(executor):
    killer = threading.Timer(2.0, ray.kill, args=(executor.workers[1],))
    killer.start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the worker of rank 1 died while the driver waited for it to finish"):
        executor.run(waits_in_collectives)
    killer.join()
    assert time.monotonic() - started < 30


# `hvdtrain ... cluster=ray`: a recipe on the Ray cluster, supervised as an mpirun launch is.

RECIPE_SETTINGS = ["train.log_every_steps=2", "train.checkpoint_every_s=0.000001", "fault.restart_wait_s=0.5"]


def started_hosts(output):
    """The hosts of the first launch, from `hvdtrain: starting N workers: mpirun ... -H HOST:SLOTS,...`."""
    launch = next(line for line in output.splitlines() if line.startswith("hvdtrain: starting "))
    words = launch.split()
    return [entry.rpartition(":")[0] for entry in words[words.index("-H") + 1].split(",")]


def test_a_recipe_on_ray_trains_to_its_target_also_when_a_node_is_lost_midway(netns_cluster, ray_cluster, tmp_path):
    """`hvdtrain cluster=ray` trains on 2 nodes that Ray chose. All processes of the node of rank
    1 are killed midway (as a machine that goes down): the job fails, hvdtrain places its workers
    again (Ray puts them on the node left free), and the run restarts from its newest checkpoint
    and reaches its target. Last in this module: the node stays down."""
    from support.commands import results_of, wait_until

    run_dir = tmp_path / "run"
    with open(tmp_path / "run.log", "w+") as log:
        process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.cli", "cluster=ray",
                                    f"cluster.ray.address={ray_cluster.address}", *RECIPE_SETTINGS,
                                    f"hydra.run.dir={run_dir}"], stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: len(list((run_dir / "checkpoints").glob("step-*.ckpt"))) >= 3, 180, "3 checkpoints")
            log.seek(0)
            hosts = started_hosts(log.read())
            assert len(set(hosts)) == 2 and set(hosts) <= {address for _, address in ray_cluster.nodes}, hosts
            lost_address = hosts[1]
            lost = next(host for host in netns_cluster.hosts if host.address == lost_address)
            lost.kill_processes()
            process.wait(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
        log.seek(0)
        output = log.read()
    assert process.returncode == 0, output
    assert "hvdtrain: restart 1 of 3: the job starts again from step" in output
    results = results_of(run_dir)
    assert (results["world_size"], results["epochs_completed"], results["target_reached"]) == (2, 12, True)
    [restart] = results["restarts"]
    assert f"{lost_address}:1" in restart["hosts_before"] and f"{lost_address}:1" not in restart["hosts_after"]
    assert len(restart["hosts_after"]) == 2
