"""hvdtrain.ray.RayExecutor on a Ray cluster whose worker nodes are network-namespace hosts
(ray_cluster.py): Ray places the workers, mpirun starts the ranks through them, and the ranks
run the driver's functions with exact collectives between the hosts."""

import socket
import sys
import threading
import time

import numpy as np
import pytest
import ray

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


def test_a_gpu_request_is_refused_naming_what_the_cluster_has(ray_cluster):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"could not place 2 workers of \{'CPU': 1, 'GPU': 1\} within "
                                           r"placement_group_timeout_s=3 s: the cluster has \{CPU: 6\}"):
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
