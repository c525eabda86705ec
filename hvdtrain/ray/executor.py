"""Horovod 0.28's RayExecutor on hvdtrain: Ray places the workers, MPI runs them.

Ray chooses the hosts and holds each worker's resources with a placement group, packed per host
as Horovod placed them. Each worker is an actor holding the relay of one rank
(hvdtrain/launch/relay.py): mpirun, started here on the driver, starts its daemons on the chosen
hosts through those actors, not ssh, and every rank it starts takes the functions its actor is
sent. So `hvd.init()` inside a function sees the world, local and cross ranks that the placement
implies, and the collectives run on hvdtrain's core between the hosts Ray chose.
"""

import contextlib
import secrets
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hvdtrain.launch import mpirun
from hvdtrain.launch.relay import RankEnded, RankFailed, RankSeat, RankRelay, mpirun_job


@dataclass
class RaySettings:
    """What RayExecutor.create_settings returns (Horovod's MiniSettings)."""
    timeout_s: float = 30.0  # for the ranks to start and answer their first call
    placement_group_timeout_s: float = 100.0
    nics: Optional[set] = None  # interfaces (names or CIDR) for MPI's traffic; None: Open MPI chooses
    verbose: int = 1
    ssh_identity_file: Optional[str] = None  # accepted for Horovod's callers; no ssh is used
    ssh_str: Optional[str] = None


@ray.remote
class RankActor:
    """One worker: holds its rank's relay on the node Ray placed it on."""

    def __init__(self, key: bytes):
        self.relay = RankRelay(ray.util.get_node_ip_address(), key)

    def seat(self):
        import os
        environment = {name: os.environ[name] for name in ("CUDA_VISIBLE_DEVICES",) if name in os.environ}
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), self.relay.address, environment

    def expect(self, rank: int, environment: Dict[str, str]):
        self.relay.expect(rank, environment)

    def start_executable(self, cls, args, kwargs, timeout_s: float):
        self.relay.call("start", (cls, args, kwargs), timeout_s)

    def execute(self, fn: Callable[[Any], Any], timeout_s: Optional[float] = None):
        return self.relay.call("execute", fn, timeout_s)

    def close(self):
        self.relay.close()


class RayExecutor:
    """Horovod's `horovod.ray.RayExecutor`: `num_workers` workers packed onto as few hosts as fit,
    or `num_hosts` hosts with `num_workers_per_host` workers each."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100,
                        nics=None):
        return RaySettings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s, nics=nics,
                           ssh_identity_file=ssh_identity_file, ssh_str=ssh_str)

    def __init__(self, settings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: int = 1, cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None, use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None, **elastic_options):
        if min_workers is not None or max_workers is not None or elastic_options:
            raise NotImplementedError("hvdtrain.ray: elastic RayExecutor (min_workers, max_workers, "
                                      f"{', '.join(elastic_options) or 'reset_limit'}) is not supported; "
                                      "give num_workers or num_hosts")
        if gpus_per_worker and not use_gpu:
            raise ValueError(f"gpus_per_worker={gpus_per_worker} needs use_gpu=True")
        if (num_workers is None) == (num_hosts is None):
            raise ValueError(f"give one of num_workers and num_hosts, not {num_workers=} and {num_hosts=}")
        for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                            ("num_workers_per_host", num_workers_per_host), ("cpus_per_worker", cpus_per_worker)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.settings = settings or RaySettings()
        self.num_workers = num_workers if num_workers is not None else num_hosts * num_workers_per_host
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers: List[Any] = []  # the actors, in rank order
        self._placement_group = None
        self._job = contextlib.ExitStack()  # holds mpirun while the executor runs
        self._key = secrets.token_bytes(32)  # of this executor's relays

    def _bundles(self):
        worker = {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}
        if self.num_hosts is None:
            return [worker] * self.num_workers, "PACK"
        host = {name: amount * self.num_workers_per_host for name, amount in worker.items()}
        return [host] * self.num_hosts, "STRICT_SPREAD"

    def _place(self):
        bundles, strategy = self._bundles()
        group = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([group.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            remove_placement_group(group)
            asked = (f"{self.num_workers} workers of {bundles[0]}" if self.num_hosts is None else
                     f"{self.num_hosts} hosts of {bundles[0]} ({self.num_workers_per_host} workers each)")
            raise TimeoutError(f"hvdtrain.ray: Ray could not place {asked} within "
                               f"placement_group_timeout_s={self.settings.placement_group_timeout_s:g} s: "
                               f"the cluster has {_resources(ray.cluster_resources())}, "
                               f"of which {_resources(ray.available_resources())} are free")
        self._placement_group = group
        per_bundle = 1 if self.num_hosts is None else self.num_workers_per_host
        return [RankActor.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                                  scheduling_strategy=PlacementGroupSchedulingStrategy(
                                      group, placement_group_bundle_index=index // per_bundle)).remote(self._key)
                for index in range(self.num_workers)]

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        """Place the workers, start a rank for each and, in each, an instance of `executable_cls`;
        on a failure, give back what was placed and raise it."""
        try:
            self._start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, executable_cls, executable_args, executable_kwargs, extra_env_vars):
        actors = self._place()
        self.workers = actors  # given back by shutdown() if the start fails from here
        seats = self._get([actor.seat.remote() for actor in actors], "to start")
        # Ranks host by host, hosts in the order Ray gave their first worker: mpirun numbers the
        # ranks so, and local and cross ranks follow from it.
        nodes = list(dict.fromkeys(node for node, *_ in seats))
        order = sorted(range(len(actors)), key=lambda index: (nodes.index(seats[index][0]), index))
        self.workers = [actors[index] for index in order]
        placed = [seats[index] for index in order]
        extra = {name: str(value) for name, value in (extra_env_vars or {}).items()}
        self._get([worker.expect.remote(rank, {**environment, **extra})
                   for rank, (worker, (_, _, _, environment)) in enumerate(zip(self.workers, placed, strict=True))], "to start")
        nic_args = []
        if self.settings.nics:
            interfaces = ",".join(sorted(self.settings.nics))
            nic_args = ["--mca", "oob_tcp_if_include", interfaces, "--mca", "btl_tcp_if_include", interfaces]
        command, env = mpirun_job([RankSeat(host, relay) for _, host, relay, _ in placed], self._key,
                                  extra_mpi_args=nic_args)
        if self.settings.verbose >= 2:
            print("hvdtrain.ray:", " ".join(command), file=sys.stderr)
        self._job.enter_context(mpirun.started(command, env=env))
        self._get([worker.start_executable.remote(executable_cls, executable_args or [], executable_kwargs or {},
                                                  self.settings.timeout_s) for worker in self.workers], "to start")

    def execute(self, fn: Callable[[Any], Any], callbacks=None) -> List[Any]:
        """`fn(executable)` on every worker; the results in rank order."""
        return self._get(self._calls(fn), "to finish")

    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks=None) -> List[Any]:
        """`fn(*args, **kwargs)` on every worker; the results in rank order."""
        return self._get(self.run_remote(fn, args, kwargs), "to finish")

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List["ray.ObjectRef"]:
        """As `run`, but the object references of the results, at once."""
        args, kwargs = list(args or []), dict(kwargs or {})
        return self._calls(lambda _: fn(*args, **kwargs))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(executable)` on the rank 0 worker only."""
        return self._get([self.workers[0].execute.remote(fn)], "to finish")[0]

    def _calls(self, fn):
        if not self.workers:
            raise RuntimeError("hvdtrain.ray: call start() before running functions")
        return [worker.execute.remote(fn) for worker in self.workers]

    def _get(self, refs, waiting_for):
        """The workers' results in rank order. On a failure, the most telling of the failures
        that come within a second: a worker that died, then a function that raised, then a rank
        that ended because another did. Every call ends: a relay notices its rank's end at once."""
        pending = dict(zip(refs, range(len(refs))))
        failures = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0 if failures else None)
            if not done:
                break
            rank = pending.pop(done[0])
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as error:
                failures.append((0, RuntimeError(f"hvdtrain.ray: the worker of rank {rank} died while the driver "
                                                 f"waited for it {waiting_for}: {str(error).splitlines()[0]}")))
            except ray.exceptions.RayTaskError as error:
                if not isinstance(error.cause, RankFailed):
                    raise
                failures.append((2 if isinstance(error.cause, RankEnded) else 1, type(error.cause)(*error.cause.args)))
        if failures:
            raise min(failures, key=lambda failure: failure[0])[1]
        return ray.get(refs)

    def shutdown(self):
        """Stop the ranks, the workers and their placement group."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.get(worker.close.remote(), timeout=10)
        self._job.close()
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None


def _resources(resources):
    # CPUs, GPUs and custom resources; not memory, nor the per-node and placement-group entries.
    shown = {name: amount for name, amount in resources.items()
             if name not in ("memory", "object_store_memory") and not name.startswith(("node:", "accelerator_type:"))
             and "_group_" not in name}
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in sorted(shown.items())) + "}"
