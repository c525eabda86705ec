"""Horovod 0.28's `horovod.spark.run` on hvdtrain: Spark holds the tasks, MPI runs the ranks.

`num_proc` Spark tasks run in one barrier stage (all at once, or none), one rank per task. Each
task holds the relay of its rank (hvdtrain/launch/relay.py) and tells the driver where it is;
mpirun, started here on the driver, reaches every task's host through those relays, not ssh, and
each rank it starts runs `fn` sent by its task. The results travel back as the tasks' own, and
come out in rank order.
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

from hvdtrain.launch import mpirun
from hvdtrain.launch.relay import RankEnded, RankFailed, RankRelay, RankSeat, host_by_host, mpirun_job

START_TIMEOUT_VARIABLE = "HOROVOD_SPARK_START_TIMEOUT"  # Horovod's, read where start_timeout is not given
DEFAULT_START_TIMEOUT_S = 600.0


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
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        raise ValueError("hvdtrain.spark.run needs an active SparkContext: make a SparkSession first")
    num_proc = num_proc or context.defaultParallelism
    if start_timeout is None:
        start_timeout = float(os.environ.get(START_TIMEOUT_VARIABLE, DEFAULT_START_TIMEOUT_S))
    key = secrets.token_bytes(32)
    call = (fn, tuple(args), dict(kwargs or {}))
    with Listener((context.getConf().get("spark.driver.host"), 0), family="AF_INET", authkey=key) as service:
        job = _SparkJob(context, num_proc, "%s:%d" % service.address, key, call, start_timeout)
        tasks = sorted(_registrations(service, job, num_proc, start_timeout))  # by partition
        tasks = [tasks[index] for index in host_by_host([host for _, host, _, _ in tasks])]
        for rank, (_, _, _, connection) in enumerate(tasks):
            connection.send((rank, {}))
        stamps = ["--output", "timestamp"] if prefix_output_with_timestamp else []
        command, job_env = mpirun_job([RankSeat(host, relay) for _, host, relay, _ in tasks], key,
                                      env=os.environ if env is None else env,
                                      extra_mpi_args=stamps + (extra_mpi_args or "").split())
        if verbose >= 2:
            print("hvdtrain.spark:", " ".join(command), file=sys.stderr)
        with mpirun.started(command, env=job_env, stdout=subprocess.PIPE if stdout else None,
                            stderr=subprocess.PIPE if stderr else None) as launcher:
            copies = [mpirun.copy_lines(stream, into)
                      for stream, into in ((launcher.stdout, stdout), (launcher.stderr, stderr)) if into]
            failure = _first_failure([connection for *_, connection in tasks], job)
            job.finished.wait()
            if failure is None and job.error is not None:
                failure = RuntimeError(f"hvdtrain.spark.run: the Spark job failed: {_first_line(job.error)}")
            if failure is not None:
                raise failure
            launcher.wait()
            for copy in copies:
                copy.join()
    return [result for _, result in sorted(job.results)]


class _SparkJob:
    """The barrier stage, collected in a thread of its own so that the driver can serve the tasks."""

    def __init__(self, context, num_proc, service_address, key, call, start_timeout):
        self.context = context
        self.group = f"hvdtrain.spark.run-{secrets.token_hex(4)}"
        self.results: List = []
        self.error: Optional[BaseException] = None
        self.finished = threading.Event()
        task = _task_function(service_address, key, call, start_timeout)
        rdd = context.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task)

        def collect():
            # Spark's job groups belong to the thread that sets them (pinned threads).
            context.setJobGroup(self.group, "hvdtrain.spark.run", interruptOnCancel=True)
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
            raise RuntimeError(f"hvdtrain.spark.run: the Spark job ended before its {num_proc} tasks started: "
                               f"{_first_line(job.error)}")
        try:
            tasks.append(arrivals.get(timeout=min(1.0, max(0.0, deadline - time.monotonic()))))
        except queue.Empty:
            if time.monotonic() >= deadline:
                job.cancel()
                raise TimeoutError(f"hvdtrain.spark.run: {len(tasks)} of num_proc={num_proc} tasks started within "
                                   f"start_timeout={start_timeout:g} s; the Spark context's default parallelism is "
                                   f"{job.context.defaultParallelism}") from None
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
