"""Horovod 0.28's `horovod.spark.run` and `run_elastic` on hvdtrain: Spark holds the tasks, MPI
runs the ranks.

`num_proc` Spark tasks run in one barrier stage (all at once, or none), one rank per task. Each
task holds the relay of its rank (hvdtrain/launch/relay.py) and tells the driver where it is;
mpirun, started here on the driver, reaches every task's host through those relays, not ssh, and
each rank it starts runs `fn` sent by its task. The results travel back as the tasks' own, and
come out in rank order.

`run_elastic` runs a Horovod Elastic function (`hvd.elastic.run`) that way, started again by
hvdtrun's elastic loop (hvdtrain/launch/hvdtrun/elastic.py), from its last commit, whenever a start
fails short of the function's own error (an executor lost) or Spark's task slots change (executors
come or go; the ranks then end the job at their next commit): each start is one barrier stage of
as many tasks as there are slots, between min_num_proc and max_num_proc.
"""

import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener, wait
from typing import Any, Callable, Dict, List, Optional, Sequence

from hvdtrain.core.exits import EXIT_COMMUNICATION
from hvdtrain.launch import mpirun
from hvdtrain.launch.hvdtrun import elastic
from hvdtrain.launch.relay import (RankEnded, RankFailed, RankRelay, RankSeat, host_by_host, mpirun_job,
                                   raised_by_the_function)
from hvdtrain.run.hosts import Host

START_TIMEOUT_VARIABLE = "HOROVOD_SPARK_START_TIMEOUT"  # Horovod's, read where start_timeout is not given
ELASTIC_TIMEOUT_VARIABLE = "HOROVOD_ELASTIC_TIMEOUT"  # Horovod's, read where elastic_timeout is not given
DEFAULT_START_TIMEOUT_S = 600.0
DEFAULT_ELASTIC_TIMEOUT_S = 600.0
ELASTIC_TERMS = elastic.Terms(launcher="hvdtrain.spark.run_elastic", min_np="min_num_proc", reset_limit="reset_limit",
                              elastic_timeout="elastic_timeout", discovered="Spark's executors offer")


def run(fn: Callable[..., Any], args: Sequence = (), kwargs: Optional[Dict] = None, num_proc: Optional[int] = None,
        start_timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None, stdout=None, stderr=None,
        verbose: int = 1, extra_mpi_args: Optional[str] = None, prefix_output_with_timestamp: bool = False
        ) -> List[Any]:
    """Run `fn(*args, **kwargs)` on `num_proc` ranks (default: Spark's default parallelism), one
    Spark task each; its results in rank order. `env` is the ranks' environment (default this
    process's); `stdout`/`stderr` take the job's output (default this process's own);
    `extra_mpi_args` is added to mpirun's command line; `prefix_output_with_timestamp` has mpirun
    stamp each line of the ranks' output. A rank that raises fails the call with RankFailed
    naming it."""
    context = _active_context("hvdtrain.spark.run")
    job = _Start("hvdtrain.spark.run", context, (fn, tuple(args), dict(kwargs or {})), _start_timeout(start_timeout),
                 stdout, stderr, verbose, _mpi_args(extra_mpi_args, prefix_output_with_timestamp))
    results, failure, _ = job.run(num_proc or context.defaultParallelism, os.environ if env is None else env)
    if failure is not None:
        raise failure
    return results


def run_elastic(fn: Callable[..., Any], args: Sequence = (), kwargs: Optional[Dict] = None,
                num_proc: Optional[int] = None, min_num_proc: Optional[int] = None,
                max_num_proc: Optional[int] = None, start_timeout: Optional[float] = None,
                elastic_timeout: Optional[float] = None, reset_limit: Optional[int] = None,
                env: Optional[Dict[str, str]] = None, stdout=None, stderr=None, verbose: int = 1, nics=None,
                prefix_output_with_timestamp: bool = False, min_np: Optional[int] = None,
                max_np: Optional[int] = None) -> List[Any]:
    """Run the Horovod Elastic function `fn(*args, **kwargs)` on between `min_num_proc` and
    `max_num_proc` ranks (both default to `num_proc`, which defaults to Spark's default
    parallelism), as many as Spark's task slots allow, one Spark task each, started again from its
    last commit as the module says; the results of its last start, in rank order. The other
    arguments are `run`'s; `nics` (interface names) carry MPI's traffic."""
    min_num_proc, max_num_proc = elastic.horovods_process_counts(min_num_proc, max_num_proc, min_np, max_np)
    context = _active_context("hvdtrain.spark.run_elastic")
    num_proc = num_proc or context.defaultParallelism
    min_num_proc, max_num_proc = min_num_proc or num_proc, max_num_proc or num_proc
    if not 1 <= min_num_proc <= max_num_proc:
        raise ValueError(f"hvdtrain.spark.run_elastic: min_num_proc {min_num_proc} must be at least 1 and at most "
                         f"max_num_proc {max_num_proc}")
    if elastic_timeout is None:
        elastic_timeout = float(os.environ.get(ELASTIC_TIMEOUT_VARIABLE, DEFAULT_ELASTIC_TIMEOUT_S))
    nic_args = mpirun.interface_args(sorted(nics)) if nics else []
    base_env = os.environ if env is None else env
    job = _Start("hvdtrain.spark.run_elastic", context, (fn, tuple(args), dict(kwargs or {})),
                 _start_timeout(start_timeout), stdout, stderr, verbose,
                 nic_args + _mpi_args(None, prefix_output_with_timestamp))
    results = []

    def start_job(num_proc, hosts):
        # the commit store's address and the hosts' version, which run_elastic puts in this
        # process's environment, reach the ranks also where the caller gave an environment
        start_env = {**base_env, **{name: os.environ[name] for name in elastic.ELASTIC_VARIABLES}}
        try:
            made, failure, status = job.run(num_proc, start_env, restarted=True)
        # The tasks did not all start (an executor Spark still counted is gone), or the stage
        # ended before they did: the loop looks at Spark's slots again.
        except (TimeoutError, RuntimeError) as error:
            print(error, file=sys.stderr, flush=True)
            return EXIT_COMMUNICATION
        if failure is None:
            results[:] = made
        elif raised_by_the_function(failure):
            raise failure  # a restart would meet it again
        return status

    options = elastic.ElasticOptions(None, min_np=min_num_proc, max_np=max_num_proc, slots_per_host=1,
                                     reset_limit=reset_limit, elastic_timeout_s=elastic_timeout,
                                     discovery=lambda: _task_slots(context), terms=ELASTIC_TERMS)
    status = elastic.run_elastic(options, start_job, [context.getConf().get("spark.driver.host")],
                                 lambda hosts: hosts)
    if status:
        raise elastic.job_ended_error(ELASTIC_TERMS, status)
    return results


def _active_context(caller):
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        raise ValueError(f"{caller} needs an active SparkContext: make a SparkSession first")
    return context


def _start_timeout(start_timeout):
    return float(os.environ.get(START_TIMEOUT_VARIABLE, DEFAULT_START_TIMEOUT_S)) if start_timeout is None \
        else start_timeout


def _mpi_args(extra_mpi_args, prefix_output_with_timestamp):
    return (["--output", "timestamp"] if prefix_output_with_timestamp else []) + (extra_mpi_args or "").split()


def _task_slots(context):
    """Spark's task slots now, as the elastic loop's hosts: one entry, as Spark, not the loop,
    chooses where a barrier stage's tasks run."""
    slots = _concurrent_tasks(context)
    return [Host("executors", slots)] if slots else []


def _concurrent_tasks(context):
    """The tasks the executors there are now can run at once, as Spark counts them for a barrier
    stage (maxNumConcurrentTasks of the default resource profile, which divides their cores by
    spark.task.cpus; in Spark's API, not PySpark's); not the default parallelism, which a user may
    set by hand and which never falls below 2."""
    spark = context._jsc.sc()
    return spark.maxNumConcurrentTasks(spark.resourceProfileManager().defaultResourceProfile())


class _Start:
    """One start of a job: a barrier stage of tasks, one rank each, run by mpirun through their relays."""

    def __init__(self, caller, context, call, start_timeout, stdout, stderr, verbose, mpi_args):
        self.caller, self.context, self.call, self.start_timeout = caller, context, call, start_timeout
        self.stdout, self.stderr, self.verbose, self.mpi_args = stdout, stderr, verbose, mpi_args

    def run(self, num_proc, env, restarted=False):
        """`num_proc` ranks with the environment `env`: (results in rank order, None, 0), or
        (None, the failure, mpirun's status where the job may be `restarted`, which waits for it)
        where a rank failed or the Spark job did; TimeoutError or RuntimeError where the tasks did
        not all start."""
        key = secrets.token_bytes(32)
        with Listener((self.context.getConf().get("spark.driver.host"), 0), family="AF_INET", authkey=key) as service:
            job = _SparkJob(self.context, num_proc, "%s:%d" % service.address, key, self.call, self.start_timeout,
                            self.caller)
            tasks = sorted(_registrations(service, job, num_proc, self.start_timeout))  # by partition
            tasks = [tasks[index] for index in host_by_host([host for _, host, _, _ in tasks])]
            for rank, (_, _, _, connection) in enumerate(tasks):
                connection.send((rank, {}))
            command, job_env = mpirun_job([RankSeat(host, relay) for _, host, relay, _ in tasks], key, env=env,
                                          extra_mpi_args=self.mpi_args)
            if self.verbose >= 2:
                print(f"{self.caller}:", " ".join(command), file=sys.stderr)
            with mpirun.started(command, env=job_env, stdout=subprocess.PIPE if self.stdout else None,
                                stderr=subprocess.PIPE if self.stderr else None) as launcher:
                copies = [mpirun.copy_lines(stream, into)
                          for stream, into in ((launcher.stdout, self.stdout), (launcher.stderr, self.stderr)) if into]
                failure = _first_failure([connection for *_, connection in tasks], job)
                job.finished.wait()
                if failure is None and job.error is not None:
                    failure = RuntimeError(f"{self.caller}: the Spark job failed: {_first_line(job.error)}")
                if failure is not None:
                    return None, failure, elastic.failed_start_status(launcher) if restarted else None
                launcher.wait()
                for copy in copies:
                    copy.join()
        return [result for _, result in sorted(job.results)], None, 0


class _SparkJob:
    """The barrier stage, collected in a thread of its own so that the driver can serve the tasks."""

    def __init__(self, context, num_proc, service_address, key, call, start_timeout, caller):
        self.context, self.caller = context, caller
        self.group = f"{caller}-{secrets.token_hex(4)}"
        self.results: List = []
        self.error: Optional[BaseException] = None
        self.finished = threading.Event()
        task = _task_function(service_address, key, call, start_timeout)
        rdd = context.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task)

        def collect():
            # Spark's job groups belong to the thread that sets them (pinned threads).
            context.setJobGroup(self.group, caller, interruptOnCancel=True)
            try:
                self.results = rdd.collect()
            except Exception as error:  # the driver reports it, with the ranks' own failure if one came
                self.error = error
            finally:
                self.finished.set()

        threading.Thread(target=collect, name="hvdtrain-spark-job", daemon=True).start()

    def cancel(self):
        self.context.cancelJobGroup(self.group)


def _registrations(service, job, num_proc, start_timeout):
    """(partition, host, relay, connection) of every task, as they start; TimeoutError naming how
    many started if not all do within `start_timeout`."""
    arrivals: "queue.Queue" = queue.Queue()

    def accept():
        while True:
            try:
                connection = service.accept()
                arrivals.put((*connection.recv(), connection))
            except (AuthenticationError, EOFError, ConnectionError):
                continue
            except OSError:
                return  # the service was closed

    threading.Thread(target=accept, name="hvdtrain-spark-service", daemon=True).start()
    tasks = []
    deadline = time.monotonic() + start_timeout
    while len(tasks) < num_proc:
        if job.finished.is_set():
            raise RuntimeError(f"{job.caller}: the Spark job ended before its {num_proc} tasks started: "
                               f"{_first_line(job.error)}")
        try:
            tasks.append(arrivals.get(timeout=min(1.0, max(0.0, deadline - time.monotonic()))))
        except queue.Empty:
            if time.monotonic() >= deadline:
                job.cancel()
                raise TimeoutError(f"{job.caller}: {len(tasks)} of num_proc={num_proc} tasks started within "
                                   f"start_timeout={start_timeout:g} s; Spark's executors can run "
                                   f"{_concurrent_tasks(job.context)} tasks at once now") from None
    return tasks


def _first_failure(connections, job):
    """The rank failure the tasks report (one that raised before one that ended because of it,
    from those that come within 2 s of the first), cancelling the stage so that Spark does not
    retry it; None when no task reports one."""
    waiting = list(connections)
    failures = []
    grace_end = None
    while waiting and (grace_end is None or time.monotonic() < grace_end):
        if grace_end is None and job.finished.is_set() and job.error is not None:
            grace_end = time.monotonic() + 2.0  # the stage failed: its tasks' reports may still come
        for connection in wait(waiting, timeout=0.5):
            waiting.remove(connection)
            try:
                kind, failure = connection.recv()
            except (EOFError, OSError):
                continue
            if kind == "failed":
                failures.append(failure)
                grace_end = grace_end or time.monotonic() + 2.0
    if not failures:
        return None
    job.cancel()
    return min(failures, key=lambda failure: isinstance(failure, RankEnded))


def _task_function(service_address, key, call, start_timeout):
    fn, args, kwargs = call

    def task(_):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        partition = context.partitionId()
        host = context.getTaskInfos()[partition].address.rpartition(":")[0]
        relay = RankRelay(host, key)
        host_name, _, port = service_address.rpartition(":")
        driver = Client((host_name, int(port)), family="AF_INET", authkey=key)
        driver.send((partition, host, relay.address))
        rank, environment = driver.recv()
        relay.expect(rank, environment)
        try:
            result = relay.call("execute", lambda _: fn(*args, **kwargs), start_timeout)
        except RankFailed as failure:
            driver.send(("failed", failure))
            relay.close()
            raise
        driver.send(("done", None))
        context.barrier()  # every rank has answered; now they may end together
        relay.close(wait_s=30.0)
        return [(rank, result)]

    return task


def _first_line(error):
    return str(error).strip().splitlines()[0] if error is not None and str(error).strip() else repr(error)
