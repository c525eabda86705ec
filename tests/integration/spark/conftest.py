"""Spark in local mode for the tests of hvdtrain.spark: one executor of 2 task slots, a JVM."""

import sys

import pytest


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hvdtrain[spark]')")
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this environment's
        session = (SparkSession.builder.master("local[2]").appName("hvdtrain-spark-tests")
                   .config("spark.ui.enabled", "false").getOrCreate())
        yield session
        session.stop()
