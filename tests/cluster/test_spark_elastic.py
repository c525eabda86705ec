"""hvdtrain.spark.run_elastic on a Spark standalone cluster whose 2 workers are network-namespace
hosts (spark_cluster.py): a Horovod Elastic function on the 4 task slots of both loses one host
midway and goes on, from its last commit, on the 2 slots left."""

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hvdtrain[spark]')")

import hvdtrain.spark  # noqa: E402
from support import elastic_functions  # noqa: E402
from support.elastic_functions import counts_steps, when_steps_done  # noqa: E402

# The executors cannot import the elastic functions' module: they travel by value, as a driver
# script's own (__main__) do.
pyspark.cloudpickle.register_pickle_by_value(elastic_functions)


def test_run_elastic_goes_on_from_its_last_commit_when_an_executors_host_is_lost(netns_cluster, spark_session,
                                                                                   capfd):
    """Once rank 0 has done 5 steps, all processes of the second worker's host are killed (a
    machine that goes down): the job fails, and run_elastic starts it again on the task slots
    Spark has left, from its last commit."""
    _, session = spark_session
    deadline = time.monotonic() + 60
    while session.sparkContext.defaultParallelism < 4:  # both executors registered (the workers are)
        assert time.monotonic() < deadline, "Spark has fewer than 4 task slots after 60 s"
        time.sleep(0.2)
    # The progress file where every host sees it (the tests' temporary directory is the first host's alone)
    shared = Path(tempfile.mkdtemp(prefix="hvdtrain-spark-elastic-", dir=Path(__file__).resolve().parent))
    progress = shared / "steps"
    killer = threading.Thread(target=when_steps_done, args=(progress, 5, netns_cluster.hosts[1].kill_processes))
    killer.start()
    try:
        results = hvdtrain.spark.run_elastic(counts_steps, args=(40, str(progress), 0.2), num_proc=4,
                                             min_num_proc=2, start_timeout=60)
    finally:
        killer.join()
        shutil.rmtree(shared)
    assert [result[:3] for result in results] == [(0, 2, 40), (1, 2, 40)], results
    assert all(result[3:] == ([4, 2], True) for result in results), results
    assert "hvdtrain.spark.run_elastic: the job failed" in capfd.readouterr().err
