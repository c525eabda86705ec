"""The seam between the engine and the transports that move a collective's bytes.

The engine decides *what* runs, in which order, on every rank alike (negotiation, fusion
plans); a backend moves the bytes of one step. There are three, all behind this interface:
- MpiBackend (mpi_backend.py): NumPy buffers in host memory, through MPI;
- NcclBackend (nccl_backend.py): CuPy buffers in device memory, through NCCL, on a CUDA stream
  of the engine's own;
- HostStagedBackend (staged_backend.py): CuPy buffers staged through pinned host memory and
  reduced by an MpiBackend, for machines without NCCL and ranks that share a GPU
  (HOROVOD_GPU_OPERATIONS=MPI).
The control plane (negotiation, the response cache, stall checks, errors) stays on MPI for all.
"""

from typing import Callable, Optional, Protocol, Sequence, Tuple

import numpy as np

# A timeline callback: record(phase, start, end, indices of the batch's regions).
Record = Callable[[str, float, float, Tuple[int, ...]], None]


class Backend(Protocol):
    transport: str  # "MPI" or "NCCL": how the timeline names its calls

    def start(self, entries: Sequence) -> None:
        """Order the step that follows after the submission of `entries` (on a device: the
        engine's stream waits for the events recorded on the callers' streams)."""

    def finish(self, entries: Sequence) -> Optional[object]:
        """End a step: the marker of its completion that the callers' handles carry (a CUDA
        event; None where the step is complete on return). The backend keeps the entries'
        buffers alive until then."""

    def allreduce(self, sources: Sequence, destinations: Sequence, op, prescale: float, postscale: float,
                  record: Optional[Record] = None) -> None:
        """Reduce flat arrays `sources[i]` into `destinations[i]` (the same array when in place).
        `op` is the request's (Average is a sum divided by the number of ranks) and the
        factors are the caller's."""

    def allgather(self, entry, first_dims: Sequence[int]):
        """Every rank's `entry.array` concatenated along the first dimension (of
        `first_dims[r]` rows from rank r), in a new array from `entry.allocate`."""

    def broadcast(self, entry, root: int) -> None:
        """`root`'s `entry.array` into every rank's `entry.output`."""

    def alltoall(self, entry) -> Tuple[object, np.ndarray]:
        """Send `entry.splits[r]` rows of `entry.array` to rank r; the rows received (a new
        array) and how many came from each rank (host integers)."""

    def reducescatter(self, entry, op, prescale: float, postscale: float):
        """Reduce `entry.array` over the ranks and return this rank's share of its rows."""

    def zeros(self, elements: int, dtype) -> object:
        """A flat buffer of zeros: what a rank that has joined contributes to an allreduce."""

    def check(self) -> None:
        """Raise HorovodInternalError if work already handed over has failed."""

    def close(self) -> None:
        """Release what the backend holds (a communicator, buffers)."""
