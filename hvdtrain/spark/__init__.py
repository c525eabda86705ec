"""Horovod on Spark without compiling: `hvdtrain.spark.run(fn, ...)` where Horovod users wrote
`horovod.spark.run(fn, ...)`."""

try:
    import pyspark  # noqa: F401
except ImportError:
    raise ImportError("hvdtrain.spark needs pyspark (and a Java 17 runtime): pip install 'hvdtrain[spark]'") from None

from hvdtrain.launch.relay import RankFailed
from hvdtrain.spark.runner import run

__all__ = ["run", "RankFailed"]
