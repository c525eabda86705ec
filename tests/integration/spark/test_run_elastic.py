"""hvdtrain.spark.run_elastic on Spark in local mode (2 task slots; tests/cluster/test_spark_elastic.py
loses an executor's host of a standalone cluster): a Horovod Elastic function runs on as many
ranks as Spark's slots, goes on from its last commit when a rank is killed, and ends at once on
an error of its own."""

import os
import signal
import threading

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hvdtrain[spark]')")

import hvdtrain.spark  # noqa: E402
from hvdtrain.run.hosts import Host  # noqa: E402
from hvdtrain.spark import runner  # noqa: E402
from support import elastic_functions  # noqa: E402
from support.elastic_functions import counts_steps, refuses_on_rank_1, when_steps_done  # noqa: E402

# The executors cannot import the elastic functions' module: they travel by value, as a driver
# script's own (__main__) do.
pyspark.cloudpickle.register_pickle_by_value(elastic_functions)


def test_run_elastic_runs_on_the_task_slots_and_returns_the_results_in_rank_order(spark):
    assert hvdtrain.spark.run_elastic(counts_steps, args=(5,), min_num_proc=1) == [(0, 2, 5, [2], True),
                                                                                  (1, 2, 5, [2], True)]


def test_an_error_of_the_function_ends_run_elastic_without_a_restart(spark, capfd):
    with pytest.raises(RuntimeError, match=r"ended with exit status 3: a rank raised an error that a restart would "
                                           r"meet again"):
        hvdtrain.spark.run_elastic(refuses_on_rank_1)
    output = capfd.readouterr().err
    assert "ValueError: rank 1 refuses on purpose" in output and "starting it again" not in output, output


def kill_rank_1():
    """SIGKILL the process of rank 1 (a rank of this machine's; mpirun's tells them apart)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=1" in environ and b"HVDTRAIN_ELASTIC_HOSTS_VERSION=0" in environ:
            os.kill(int(pid), signal.SIGKILL)


def test_run_elastic_goes_on_from_its_last_commit_when_a_rank_is_killed(spark, tmp_path, capfd):
    progress = tmp_path / "steps"
    killer = threading.Thread(target=when_steps_done, args=(progress, 5, kill_rank_1))
    killer.start()
    try:
        results = hvdtrain.spark.run_elastic(counts_steps, args=(30, str(progress), 0.1))
    finally:
        killer.join()
    assert results == [(0, 2, 30, [2], True), (1, 2, 30, [2], True)]
    assert "hvdtrain.spark.run_elastic: the job failed (exit status" in capfd.readouterr().err


def test_run_elastic_refuses_fewer_processes_at_most_than_at_least(spark):
    with pytest.raises(ValueError, match="min_num_proc 3 must be at least 1 and at most max_num_proc 2"):
        hvdtrain.spark.run_elastic(counts_steps, min_num_proc=3, max_num_proc=2)


def test_run_elastic_takes_horovods_deprecated_names_with_its_warnings(spark):
    with pytest.warns(DeprecationWarning) as caught:
        assert len(hvdtrain.spark.run_elastic(counts_steps, args=(1,), min_np=1, max_np=1)) == 1
    assert sorted(str(warning.message) for warning in caught) == [
        "max_np is deprecated, use max_num_proc instead", "min_np is deprecated, use min_num_proc instead"]
    assert {warning.filename for warning in caught} == {__file__}  # pointed at the call


def test_the_slots_are_the_executors_not_a_default_parallelism_set_by_hand(spark, monkeypatch):
    context = spark.sparkContext
    monkeypatch.setattr(type(context), "defaultParallelism", property(lambda _: 8))  # as spark.default.parallelism=8
    assert runner._task_slots(context) == [Host("executors", 2)]  # local[2]
