"""A Chrome-trace (Perfetto) timeline of every collective, written by rank 0.

Each tensor is a row ("process" in trace terms), named as Horovod names it: the operation and
the tensor, `allreduce.NAME`. Its phases are complete events: the negotiation, then the
operation itself with QUEUE, MEMCPY_IN_FUSION_BUFFER, the transport call (MPI_ALLREDUCE, ...)
and MEMCPY_OUT_FUSION_BUFFER nested inside, as in Horovod.

Events reach the file as collectives finish (`flush()`), not at the end: a job that hangs or
crashes leaves a timeline that shows how far it got. Until `close()` the file is a JSON array
without its closing bracket, which chrome://tracing and Perfetto load as it is.
"""

import json
import threading
import time

from .negotiation import AUTO_NAME_MARK


def row_name(kind, tensor_name):
    """Horovod's name of a tensor's row: `allreduce.grad.w`; unnamed collectives already have
    the form `allreduce.noname.3`."""
    if AUTO_NAME_MARK in tensor_name:
        return tensor_name
    return f"{kind.value}.{tensor_name}"


class Timeline:
    def __init__(self, path, mark_cycles=False):
        self.path = path
        self.mark_cycles = mark_cycles
        self._file = open(path, "w", buffering=1 << 20)
        self._file.write("[\n")
        self._separator = ""
        self._origin = time.perf_counter()
        self._rows = {}  # (kind, tensor name) -> pid
        self._lock = threading.Lock()

    def _micros(self, t):
        return (t - self._origin) * 1e6

    def _write(self, text):
        self._file.write(self._separator + text)
        self._separator = ",\n"

    def _row(self, kind, tensor_name):
        row = self._rows.get((kind, tensor_name))
        if row is None:
            row = self._rows[kind, tensor_name] = len(self._rows) + 1
            name = row_name(kind, tensor_name)
            self._write(json.dumps({"name": "process_name", "ph": "M", "pid": row, "args": {"name": name}}))
            self._write(json.dumps({"name": "process_sort_index", "ph": "M", "pid": row, "args": {"sort_index": row}}))
        return row

    def span(self, kind, tensor_name, phase, start, end):
        """A phase of the collective `kind` of `tensor_name` from `start` to `end`
        (time.perf_counter() values)."""
        with self._lock:
            if self._file is None:
                return
            row = self._row(kind, tensor_name)
            self._write(
                f'{{"name":"{phase}","ph":"X","ts":{self._micros(start):.3f},'
                f'"dur":{max(0.0, (end - start) * 1e6):.3f},"pid":{row},"tid":0}}'
            )

    def cycle_start(self, t):
        if not self.mark_cycles:
            return
        with self._lock:
            if self._file is not None:
                self._write(f'{{"name":"CYCLE_START","ph":"i","s":"g","ts":{self._micros(t):.3f},"pid":0,"tid":0}}')

    def flush(self):
        """Hand what was written to the OS. The engine calls it once per finished step (a fused
        batch, a broadcast), before the callers learn their collectives are done."""
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self):
        with self._lock:
            if self._file is None:
                return
            self._file.write("\n]\n")
            self._file.close()
            self._file = None
