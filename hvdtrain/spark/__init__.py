"""Horovod on Spark without compiling: `hvdtrain.spark.run(fn, ...)` where Horovod users wrote
`horovod.spark.run(fn, ...)`."""

from hvdtrain.launch.relay import RankFailed
from hvdtrain.spark.runner import run

__all__ = ["run", "RankFailed"]
