"""Horovod on Spark without compiling: `hvdtrain.spark.run(fn, ...)` and `run_elastic(fn, ...)` where
Horovod users wrote `horovod.spark.run(fn, ...)` and `horovod.spark.run_elastic(fn, ...)`."""

try:
    import pyspark  # noqa: F401
except ImportError:
    raise ImportError("hvdtrain.spark needs pyspark (and a Java 17 runtime): pip install 'hvdtrain[spark]'") from None

from hvdtrain.launch.relay import RankFailed
from hvdtrain.spark.runner import run, run_elastic

__all__ = ["run", "run_elastic", "RankFailed"]
