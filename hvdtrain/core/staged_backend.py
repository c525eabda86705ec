"""Collectives on device buffers staged through pinned host memory and run by the MPI backend:
HOROVOD_GPU_OPERATIONS=MPI (or one operation's HOROVOD_GPU_<OP>=MPI). It serves machines
without NCCL and several ranks on one GPU, which NCCL refuses.

The engine's stream waits for the callers' events, copies the buffers to pinned memory, and the
engine thread waits for that copy (this path blocks the engine, not the callers); MPI reduces on
the host; the results go back on the same stream, and the callers' streams wait for that.
"""

import numpy as np

from .mpi_backend import MpiBackend
from .nccl_backend import _DeviceStream, start_on_devices


class HostStagedBackend(_DeviceStream):
    transport = "MPI"

    def __init__(self, comm, settings, device_of, adasum_hosts=None):
        """`adasum_hosts`: as MpiBackend's."""
        device, _ = start_on_devices(comm, device_of, "the host-staged GPU path", needs_nccl=False)
        super().__init__(device)
        self._mpi = MpiBackend(comm, settings, adasum_hosts)
        self._pinned = None  # (memory, nbytes)

    def _staging(self, nbytes):
        """A pinned host buffer of at least `nbytes`, reused: the stream is in order, so the
        copies of one step finish before the next step's copies into it begin, and the host
        writes it only between a synchronize and the copies back."""
        if self._pinned is None or self._pinned[1] < nbytes:
            self.stream.synchronize()  # copies back from the old buffer may still be running
            memory = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1))
            self._pinned = (memory, nbytes)
        return np.frombuffer(self._pinned[0], np.uint8, self._pinned[1])

    def _download(self, arrays):
        """Host copies of device arrays, in one staging buffer; returns after they arrived."""
        staging = self._staging(sum(a.nbytes for a in arrays))
        views, offset = [], 0
        for array in arrays:
            view = staging[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
            array.data.copy_to_host_async(view.ctypes.data, array.nbytes, self.stream)
            views.append(view)
            offset += array.nbytes
        self.stream.synchronize()
        return views

    def _upload(self, host, device_array):
        device_array.data.copy_from_host_async(host.ctypes.data, host.nbytes, self.stream)

    def allreduce(self, sources, destinations, op, prescale, postscale, record=None):
        self.enter()
        views = self._download(sources)
        self._mpi.allreduce(views, views, op, prescale, postscale, record)
        for view, destination in zip(views, destinations):
            self._upload(view, destination)

    def allgather(self, entry, first_dims):
        self.enter()
        (source,) = self._download([entry.array])
        gathered = self._mpi.gather_rows(source, first_dims)
        output = self.allocate(entry, gathered.shape, gathered.dtype)
        self._upload(self.keep(gathered), output)
        return output

    def broadcast(self, entry, root):
        self.enter()
        (view,) = self._download([entry.array])
        self._mpi.broadcast_bytes(view, view, root)
        self._upload(view, entry.output)

    def alltoall(self, entry):
        self.enter()
        (source,) = self._download([entry.array])
        received, received_splits = self._mpi.exchange_rows(source, entry.splits)
        output = self.allocate(entry, received.shape, received.dtype)
        self._upload(self.keep(received), output)
        return output, received_splits

    def reducescatter(self, entry, op, prescale, postscale):
        self.enter()
        (source,) = self._download([entry.array])
        share = self._mpi.reduce_rows(source, op, prescale, postscale)
        output = self.allocate(entry, share.shape, share.dtype)
        self._upload(self.keep(share), output)
        return output
