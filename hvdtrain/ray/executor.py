"""Horovod 0.28's RayExecutor on hvdtrain: Ray places the workers, MPI runs them.

Ray chooses the hosts and holds each worker's resources with a placement group, packed per host
as Horovod placed them (hvdtrain/launch/ray_placement.py). Each worker is an actor holding the
relay of one rank (hvdtrain/launch/relay.py): mpirun, started here on the driver, starts its daemons on the chosen
hosts through those actors, not ssh, and every rank it starts takes the functions its actor is
sent. So `hvd.init()` inside a function sees the world, local and cross ranks that the placement
implies, and the collectives run on hvdtrain's core between the hosts Ray chose.

With `min_workers`, the executor is Horovod's elastic one, for functions that use Horovod Elastic
(`hvd.elastic.run`). MPI cannot change a running job's members, so, as hvdtrun does for elastic
scripts (hvdtrain/launch/hvdtrun/elastic.py, whose loop this drives), `run` starts a job on the
workers Ray's nodes hold (as many as their CPUs, and GPUs, fit, up to `max_workers`, once there
are `min_workers`; or on the hosts of a discovery of the caller's), each on the node the loop
chose, and starts it again, from the function's last commit, when a node is lost or another joins
(then at the ranks' next commit). Its results are those of the start that finished.
"""

import contextlib
import functools
import secrets
import sys
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.placement_group import get_current_placement_group
from ray.util.queue import Empty, Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hvdtrain.core.exits import EXIT_COMMUNICATION
from hvdtrain.launch import mpirun
from hvdtrain.launch.hvdtrun.elastic import (LONGEST_COOLDOWN_S, ElasticOptions, Terms, failed_start_status,
                                             horovods_process_counts, job_ended_error, run_elastic)
from hvdtrain.launch.ray_placement import place
from hvdtrain.launch.relay import RankEnded, RankFailed, mpirun_job, raised_by_the_function
from hvdtrain.run.hosts import Host

HAND_OVER_POLL_S = 0.1  # how long the driver's callback thread waits for a logged value at a time
ELASTIC_TERMS = Terms(launcher="hvdtrain.ray", min_np="min_workers", reset_limit="reset_limit",
                      elastic_timeout="elastic_timeout", discovered="Ray's alive nodes offer")


@dataclass
class RaySettings:
    """What RayExecutor.create_settings returns (Horovod's MiniSettings)."""
    timeout_s: float = 30.0  # for the ranks to start and answer their first call
    placement_group_timeout_s: float = 100.0
    nics: Optional[set] = None  # interfaces (names or CIDR) for MPI's traffic; None: Open MPI chooses
    verbose: int = 1
    ssh_identity_file: Optional[str] = None  # accepted for Horovod's callers; no ssh is used
    ssh_str: Optional[str] = None
    # With override_discovery=False, an elastic executor's hosts: an object whose
    # find_available_hosts_and_slots() gives {Ray node address: slots}, as Horovod's HostDiscovery
    discovery: Any = None


class RayExecutor:
    """Horovod's `horovod.ray.RayExecutor`: `num_workers` workers packed onto as few hosts as fit,
    or `num_hosts` hosts with `num_workers_per_host` workers each."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100,
                        nics=None):
        return RaySettings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s, nics=nics,
                           ssh_identity_file=ssh_identity_file, ssh_str=ssh_str)

    def __init__(self, settings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: Optional[int] = None, cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None, use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None, cooldown_range: Optional[List[int]] = None,
                 elastic_timeout: int = 600, override_discovery: bool = True):
        if gpus_per_worker and not use_gpu:
            raise ValueError(f"gpus_per_worker={gpus_per_worker} needs use_gpu=True")
        self.elastic = None
        if min_workers is not None or max_workers is not None:
            if override_discovery:
                discovery = functools.partial(ray_hosts, cpus_per_worker, (gpus_per_worker or 1) if use_gpu else 0)
                terms = ELASTIC_TERMS
            else:
                discovery = _settings_discovery(settings)
                terms = replace(ELASTIC_TERMS, discovered="settings.discovery found")
            self.elastic = _elastic_options(num_workers, num_hosts, min_workers, max_workers, reset_limit,
                                            cooldown_range, elastic_timeout, discovery, terms)
        elif (num_workers is None) == (num_hosts is None):
            raise ValueError(f"give one of num_workers and num_hosts, not {num_workers=} and {num_hosts=}")
        for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                            ("num_workers_per_host", num_workers_per_host), ("cpus_per_worker", cpus_per_worker)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.settings = settings or RaySettings()
        num_workers_per_host = num_workers_per_host or 1
        self.num_workers = num_workers if num_workers is not None or num_hosts is None \
            else num_hosts * num_workers_per_host
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self._placement = None
        self._job = contextlib.ExitStack()  # holds mpirun while the executor runs
        self._key = secrets.token_bytes(32)  # of this executor's relays
        self._started = None  # an elastic executor's start(): what each start of its job starts with

    @property
    def workers(self) -> List[Any]:
        """The workers' actors, in rank order (none before start and after shutdown)."""
        return self._placement.workers if self._placement is not None else []

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
        environment = {name: str(value) for name, value in (extra_env_vars or {}).items()}
        executable = (executable_cls, executable_args or [], executable_kwargs or {})
        if self.elastic is not None:  # its workers are placed by each start of its job, in run
            self._started = environment, executable
            return
        # As Horovod's: packed workers go into the placement group this runs in (a Ray Tune
        # trial's), where there is one and use_current_placement_group is set.
        current = get_current_placement_group() if self.use_current_placement_group and not self.num_hosts else None
        self._job.enter_context(self._job_on(self.num_workers if not self.num_hosts else None, environment,
                                             executable, group=current))

    @contextlib.contextmanager
    def _job_on(self, num_workers, environment, executable, group=None, on_nodes=None):
        """A job of `num_workers` placed workers (None: num_hosts of num_workers_per_host, or
        those of `on_nodes`, (node address, workers) pairs), each rank running an instance of the
        executable (class, args, kwargs); the workers, mpirun and the ranks go when the block
        ends. Yields mpirun's process."""
        try:
            self._placement = place(self._key, self.settings.placement_group_timeout_s, self.cpus_per_worker,
                                    self.gpus_per_worker, num_workers=num_workers,
                                    num_hosts=None if num_workers or on_nodes else self.num_hosts,
                                    workers_per_host=self.num_workers_per_host, group=group, environment=environment,
                                    on_nodes=on_nodes)
        except TimeoutError as error:
            raise TimeoutError(f"hvdtrain.ray: {error} (placement_group_timeout_s)") from None
        try:
            nic_args = mpirun.interface_args(sorted(self.settings.nics)) if self.settings.nics else []
            command, env = mpirun_job(self._placement.seats, self._key, extra_mpi_args=nic_args)
            if self.settings.verbose >= 2:
                print("hvdtrain.ray:", " ".join(command), file=sys.stderr)
            with mpirun.started(command, env=env) as process:
                self._get([worker.start_executable.remote(*executable, self.settings.timeout_s)
                           for worker in self.workers], "to start")
                yield process
        finally:
            self._placement.close()
            self._placement = None

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable[[Any], Any]]] = None) -> List[Any]:
        """`fn(executable)` on every worker; the results in rank order. Each of `callbacks` is
        called on the driver with each value the ranks log (`hvdtrain.ray.ray_logger.log`)."""
        with _handing_to(callbacks) as logged:
            if self.elastic is not None:
                return self._run_elastic(fn, logged)
            return self._get(self._calls(fn, logged), "to finish")

    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable[[Any], Any]]] = None) -> List[Any]:
        """`fn(*args, **kwargs)` on every worker; the results in rank order. Each of `callbacks`
        is called on the driver with each value the ranks log (`hvdtrain.ray.ray_logger.log`)."""
        args, kwargs = list(args or []), dict(kwargs or {})
        return self.execute(lambda _: fn(*args, **kwargs), callbacks)

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None, callbacks=None) -> List["ray.ObjectRef"]:
        """As `run`, but the object references of the results, at once."""
        if self.elastic is not None:
            raise NotImplementedError("hvdtrain.ray: an elastic RayExecutor has no run_remote: its workers last "
                                      "one start of the job; use run")
        if callbacks:
            raise NotImplementedError("hvdtrain.ray: run_remote returns before the ranks log anything, so it "
                                      "cannot call callbacks; use run or execute")
        args, kwargs = list(args or []), dict(kwargs or {})
        return self._calls(lambda _: fn(*args, **kwargs))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(executable)` on the rank 0 worker only."""
        if self.elastic is not None:
            raise NotImplementedError("hvdtrain.ray: an elastic RayExecutor has no execute_single; use execute")
        return self._get([self.workers[0].execute.remote(fn)], "to finish")[0]

    def _run_elastic(self, fn, logged):
        """`fn(executable)` on every rank of each start of the elastic job, until one start
        finishes; its results in rank order. A function that raises ends the job at once: a
        restart would meet its error again. What the ranks log goes into `logged`."""
        if self._started is None:
            raise RuntimeError("hvdtrain.ray: call start() before running functions")
        environment, executable = self._started
        results = []

        def start_job(num_proc, hosts):
            # On the hosts the loop chose, not wherever Ray would pack the workers: it leaves out
            # the hosts it blacklisted, and a discovery of the caller's own names the hosts to use.
            try:
                with self._job_on(None, environment, executable,
                                  on_nodes=[(host.host, host.slots) for host in hosts]) as process:
                    try:
                        results[:] = self._get(self._calls(fn, logged), "to finish")
                        return 0
                    except RuntimeError as error:
                        if raised_by_the_function(error):
                            raise
                    return failed_start_status(process)
            # Ray could not place the workers (a node it still counts alive is gone, or others took
            # its resources), or one died before its rank started: the loop looks for hosts again.
            except (TimeoutError, RuntimeError) as error:
                if raised_by_the_function(error):
                    raise
                print(error if str(error).startswith("hvdtrain.ray: ") else f"hvdtrain.ray: {error}", file=sys.stderr,
                      flush=True)
                return EXIT_COMMUNICATION

        def answering(hosts):
            alive = {host.host for host in self.elastic.discovery()}
            return [host for host in hosts if host.host in alive]

        status = run_elastic(self.elastic, start_job, [ray.util.get_node_ip_address()], answering)
        if status:
            raise job_ended_error(self.elastic.terms, status)
        return results

    def _calls(self, fn, logged=None):
        if not self.workers:
            raise RuntimeError("hvdtrain.ray: call start() before running functions")
        return [worker.execute.remote(fn, logged=logged) for worker in self.workers]

    def _get(self, refs, waiting_for):
        """The workers' results in rank order. On a failure, the most telling of the failures
        that come within a second: a worker that died, then a function that raised, then a rank
        that ended because another did. Every call ends: a relay notices its rank's end at once."""
        pending = {ref: rank for rank, ref in enumerate(refs)}
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
        self._started = None


@contextlib.contextmanager
def _handing_to(callbacks):
    """A queue for what the ranks log during the block (None without callbacks), whose values
    a thread of the driver hands to each callback as they arrive; the rest once the block ends.
    A callback's error stops the handing over and is raised at the end of the block, unless the
    block raised (that error says more)."""
    if not callbacks:
        yield None
        return
    # A queue of no resources on the driver's node, which a job outlives only if it does (not on a
    # node that may be lost, nor in a placement group the caller runs in, a Ray Tune trial's)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    logged = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
    block_ended = threading.Event()
    failed = []

    def hand_over():
        while True:
            try:
                value = logged.get(timeout=HAND_OVER_POLL_S)
            except Empty:
                if block_ended.is_set():
                    return
                continue
            except ray.exceptions.RayError as error:  # raised to the caller when the block ends
                failed.append(RuntimeError(f"hvdtrain.ray: the queue of the values the ranks log was lost: {error}"))
                return
            if failed:
                continue
            try:
                for callback in callbacks:
                    callback(value)
            except Exception as error:  # raised to the caller when the block ends
                failed.append(error)

    thread = threading.Thread(target=hand_over, name="hvdtrain-ray-callbacks", daemon=True)
    thread.start()
    try:
        yield logged
    finally:
        block_ended.set()
        thread.join()
        logged.shutdown()
    if failed:
        raise failed[0]


@dataclass
class ElasticRaySettings:
    """What ElasticRayExecutor.create_settings returns (the part of Horovod's ElasticSettings that
    means something here)."""
    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    nics: Optional[set] = None
    verbose: int = 1
    cooldown_range: Optional[List[int]] = None
    ssh_identity_file: Optional[str] = None  # accepted for Horovod's callers; no ssh is used
    discovery: Any = None  # as RaySettings.discovery


class ElasticRayExecutor:
    """Horovod 0.28's ElasticRayExecutor (deprecated there since 0.25 for RayExecutor's
    min_workers), as an elastic RayExecutor: `run(worker_fn)` calls `worker_fn()` on every rank."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None, reset_limit: Optional[int] = None,
                        elastic_timeout: int = 600, timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        nics=None, min_np: Optional[int] = None, max_np: Optional[int] = None, verbose: int = 1,
                        cooldown_range: Optional[List[int]] = None, **others) -> ElasticRaySettings:
        if others:
            raise ValueError(f"hvdtrain.ray: ElasticRayExecutor.create_settings does not take "
                             f"{', '.join(sorted(others))}")
        min_num_proc, max_num_proc = horovods_process_counts(min_num_proc, max_num_proc, min_np, max_np)
        return ElasticRaySettings(min_num_proc, max_num_proc, reset_limit, elastic_timeout, timeout_s, nics,
                                  int(verbose), cooldown_range, ssh_identity_file)

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False, cpus_per_slot: int = 1,
                 gpus_per_slot: Optional[int] = None, env_vars: Optional[Dict] = None, override_discovery: bool = True):
        self._executor = RayExecutor(
            RaySettings(timeout_s=settings.timeout_s, nics=settings.nics, verbose=settings.verbose,
                        discovery=settings.discovery),
            min_workers=settings.min_num_proc, max_workers=settings.max_num_proc, reset_limit=settings.reset_limit,
            cooldown_range=settings.cooldown_range, elastic_timeout=settings.elastic_timeout,
            cpus_per_worker=cpus_per_slot, use_gpu=use_gpu, gpus_per_worker=gpus_per_slot,
            override_discovery=override_discovery)
        self._env_vars = env_vars

    def start(self):
        self._executor.start(extra_env_vars=self._env_vars)

    def run(self, worker_fn: Callable[[], Any], callbacks=None) -> List[Any]:
        """`worker_fn()` on every rank of the elastic job; the results of its last start, in rank order."""
        return self._executor.run(worker_fn, callbacks=callbacks)


def ray_hosts(cpus_per_worker, gpus_per_worker):
    """Ray's alive nodes that hold a worker, each with as many slots as it holds workers (as
    Horovod's RayHostDiscovery counts them: from the nodes' resources, not what is free now)."""
    hosts = []
    for node in ray.nodes():
        resources = node["Resources"]
        slots = int(resources.get("CPU", 0) // cpus_per_worker)
        if gpus_per_worker:
            slots = min(slots, int(resources.get("GPU", 0) // gpus_per_worker))
        if node["Alive"] and slots:
            hosts.append(Host(node["NodeManagerAddress"], slots))
    return sorted(hosts, key=lambda host: host.host)  # one order: the elastic loop sees a change only where one is


def _settings_discovery(settings):
    """The hosts of `settings.discovery` (override_discovery=False): a callable giving them as the
    elastic loop takes them; ValueError where the settings hold no such discovery."""
    discovery = getattr(settings, "discovery", None)
    if not callable(getattr(discovery, "find_available_hosts_and_slots", None)):
        raise ValueError(f"override_discovery=False needs settings.discovery, an object with "
                         f"find_available_hosts_and_slots() (Horovod's HostDiscovery), got {discovery!r}")

    def hosts():
        found = discovery.find_available_hosts_and_slots()
        return [Host(str(host), int(slots)) for host, slots in sorted(found.items()) if int(slots) > 0]

    return hosts


def _elastic_options(num_workers, num_hosts, min_workers, max_workers, reset_limit, cooldown_range, elastic_timeout,
                     discovery, terms):
    """The elastic loop's options for RayExecutor's elastic arguments; ValueError for bad ones."""
    if num_workers is not None or num_hosts is not None:
        raise ValueError(f"give min_workers (an elastic job) or num_workers/num_hosts, not both: {min_workers=}, "
                         f"{num_workers=}, {num_hosts=}")
    if not isinstance(min_workers, int) or min_workers < 1:
        raise ValueError(f"min_workers must be a positive integer, got {min_workers!r}")
    if max_workers is not None and (not isinstance(max_workers, int) or max_workers < min_workers):
        raise ValueError(f"max_workers must be an integer of at least min_workers {min_workers}, got {max_workers!r}")
    if reset_limit is not None and (not isinstance(reset_limit, int) or reset_limit < 0):
        raise ValueError(f"reset_limit must be an integer of at least 0, got {reset_limit!r}")
    if cooldown_range is not None:
        low, high = cooldown_range
        if not 0 < low <= high <= LONGEST_COOLDOWN_S:
            raise ValueError(f"cooldown_range {list(cooldown_range)}: the low must be positive and at most the high, "
                             f"and the high at most {LONGEST_COOLDOWN_S}")
    if not elastic_timeout or elastic_timeout <= 0:
        raise ValueError(f"elastic_timeout must be a positive number of seconds, got {elastic_timeout!r}")
    return ElasticOptions(None, min_np=min_workers, max_np=max_workers, slots_per_host=1, reset_limit=reset_limit,
                          elastic_timeout_s=elastic_timeout,
                          blacklist_cooldown_s=tuple(cooldown_range) if cooldown_range else None,
                          discovery=discovery, terms=terms)
