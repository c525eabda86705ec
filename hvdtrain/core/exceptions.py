"""Errors the engine raises; the framework adapters re-export them under Horovod's names."""


class HorovodInternalError(RuntimeError):
    """A collective failed: the ranks disagreed about it, it stalled, or the engine stopped."""


class TensorMismatchError(HorovodInternalError):
    """Ranks submitted the same tensor name with different shape, dtype, op, scale or root.

    Raised on every rank that submitted the tensor, naming the field and what each rank gave.
    """

    def __init__(self, message, name=None, field=None, values_by_rank=None):
        super().__init__(message)
        self.tensor_name = name
        self.field = field
        self.values_by_rank = values_by_rank or {}


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-mode signal; kept for API compatibility, never raised here."""
