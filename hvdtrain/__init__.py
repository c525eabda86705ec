"""hvdtrain: data-parallel training recipes on a Horovod-style communication core."""

__version__ = "0.1.0"
