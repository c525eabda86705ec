"""hvdtrain.spark.run on Spark in local mode (one executor of 2 task slots: a JVM, where a
local cluster of executors starts three; tests/cluster/test_spark.py runs a standalone cluster
across hosts): one rank per task of a barrier stage, started by mpirun through the tasks,
results in rank order."""

import io
import re
import sys
import time

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hvdtrain[spark]')")

import hvdtrain.spark  # noqa: E402
from hvdtrain.spark import RankFailed  # noqa: E402

# The executors cannot import this test module: its functions travel by value, as a driver
# script's own (__main__) do.
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def ranks_summary(offset):
    from hvdtrain import core

    core.init()
    summed = core.allreduce_async(np.arange(4, dtype=np.int64) * (core.rank() + offset), name="sum",
                                  op=core.ReduceOp.SUM).wait()
    print(f"rank {core.rank()} says hello")
    return dict(rank=core.rank(), size=core.size(), local_rank=core.local_rank(), summed=summed.tolist())


def test_run_returns_each_rank_result_in_rank_order_and_its_output(spark):
    output = io.StringIO()
    summaries = hvdtrain.spark.run(ranks_summary, args=(1,), stdout=output)
    assert [(s["rank"], s["size"], s["local_rank"]) for s in summaries] == [(0, 2, 0), (1, 2, 1)]
    assert all(s["summed"] == [0, 3, 6, 9] for s in summaries)
    assert {"rank 0 says hello", "rank 1 says hello"} <= set(output.getvalue().splitlines())


def test_output_lines_can_carry_a_timestamp(spark):
    output = io.StringIO()
    hvdtrain.spark.run(ranks_summary, args=(0,), stdout=output, prefix_output_with_timestamp=True)
    stamped = [line for line in output.getvalue().splitlines() if line.endswith("says hello")]
    assert len(stamped) == 2, output.getvalue()
    assert all(re.match(r"\[\w{3} \w{3} +\d+ [\d:]{8} \d{4}\]", line) for line in stamped), stamped


def test_num_proc_defaults_to_the_default_parallelism_and_kwargs_reach_fn(spark):
    summaries = hvdtrain.spark.run(ranks_summary, kwargs={"offset": 0})
    assert len(summaries) == spark.sparkContext.defaultParallelism == 2
    assert all(s["summed"] == [0, 1, 2, 3] for s in summaries)


def fails_on_rank_1():
    from hvdtrain import core

    core.init()
    if core.rank() == 1:
        raise ValueError("rank 1 refuses on purpose")
    return core.rank()


def test_a_rank_that_raises_fails_the_call_naming_the_rank(spark):
    with pytest.raises(RankFailed, match=r"rank 1 \(\S+\) failed: ValueError: rank 1 refuses on purpose"):
        hvdtrain.spark.run(fails_on_rank_1)


def test_more_ranks_than_task_slots_are_refused_within_start_timeout(spark):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"0 of num_proc=3 tasks started within start_timeout=3 s; "
                                          r"Spark.s executors can run 2 tasks at once now"):
        hvdtrain.spark.run(ranks_summary, args=(0,), num_proc=3, start_timeout=3)
    assert time.monotonic() - started < 15
