"""Horovod 0.28's RayExecutor on hvdtrain: Ray places the workers, MPI runs them.

Ray chooses the hosts and holds each worker's resources with a placement group, packed per host
as Horovod placed them (hvdtrain/launch/ray_placement.py). Each worker is an actor holding the
relay of one rank (hvdtrain/launch/relay.py): mpirun, started here on the driver, starts its daemons on the chosen
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
from ray.util.placement_group import get_current_placement_group

from hvdtrain.launch import mpirun
from hvdtrain.launch.ray_placement import place
from hvdtrain.launch.relay import RankEnded, RankFailed, mpirun_job


@dataclass
class RaySettings:
    """What RayExecutor.create_settings returns (Horovod's MiniSettings)."""
    timeout_s: float = 30.0  # for the ranks to start and answer their first call
    placement_group_timeout_s: float = 100.0
    nics: Optional[set] = None  # interfaces (names or CIDR) for MPI's traffic; None: Open MPI chooses
    verbose: int = 1
    ssh_identity_file: Optional[str] = None  # accepted for Horovod's callers; no ssh is used
    ssh_str: Optional[str] = None


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
        num_workers_per_host = num_workers_per_host or 1
        self.num_workers = num_workers if num_workers is not None else num_hosts * num_workers_per_host
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self._placement = None
        self._job = contextlib.ExitStack()  # holds mpirun while the executor runs
        self._key = secrets.token_bytes(32)  # of this executor's relays

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
        # As Horovod's: packed workers go into the placement group this runs in (a Ray Tune
        # trial's), where there is one and use_current_placement_group is set.
        current = get_current_placement_group() if self.use_current_placement_group and not self.num_hosts else None
        try:
            self._placement = place(self._key, self.settings.placement_group_timeout_s, self.cpus_per_worker,
                                    self.gpus_per_worker, num_workers=None if self.num_hosts else self.num_workers,
                                    num_hosts=self.num_hosts, workers_per_host=self.num_workers_per_host,
                                    group=current,
                                    environment={name: str(value) for name, value in (extra_env_vars or {}).items()})
        except TimeoutError as error:
            raise TimeoutError(f"hvdtrain.ray: {error} (placement_group_timeout_s)") from None
        nic_args = []
        if self.settings.nics:
            interfaces = ",".join(sorted(self.settings.nics))
            nic_args = ["--mca", "oob_tcp_if_include", interfaces, "--mca", "btl_tcp_if_include", interfaces]
        command, env = mpirun_job(self._placement.seats, self._key, extra_mpi_args=nic_args)
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
        if self._placement is not None:
            self._placement.close()
            self._placement = None
