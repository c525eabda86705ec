"""The engine: one background thread that owns all communication.

Callers submit named collectives from any thread and get a Handle; what can never work is
refused on the caller's thread (submission.py). Every cycle (HOROVOD_CYCLE_TIME) the thread
1. takes what was submitted since the last cycle;
2. agrees with the other ranks which tensors are ready everywhere (negotiation.py): one
   bitwise-AND allreduce for tensors seen before, a coordinator round for anything else;
3. runs the agreed collectives in one order on every rank, fusing allreduces (fusion.py)
   and handing the bytes to the backend of the buffers' device and the operation (backend.py):
   MPI for host memory; for device memory NCCL, or MPI through pinned host memory, as
   HOROVOD_GPU_OPERATIONS and HOROVOD_GPU_<OPERATION> choose.
"""

import collections
import ctypes
import itertools
import logging
import math
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Dict

import numpy as np

from . import cuda
from .backend import Backend
from .exceptions import HorovodInternalError, TensorMismatchError
from .discovery import discover
from .fusion import plan_batches
from .mpi_backend import MpiBackend
from .negotiation import Coordinator, ResponseCache, cacheable
from .requests import ALLREDUCE, JOIN, Entry, Handle, Kind, ReduceOp, Request, numpy_dtype
from .submission import REFUSALS, Submissions
from .timeline import Timeline

log = logging.getLogger("hvdtrain.core")

_WANTS_ROUND, _JOINED, _SHUTDOWN = 1, 2, 4
_FLAG_MASK = 7

IDLE_WAIT_S = 0.01
ADASUM_WITHIN_HOSTS_FIRST = "MPI, Adasum across hosts"  # the key of the device backend that runs it
DEVICE_CHECK_INTERVAL_S = 0.1  # how often device work in flight is asked for an asynchronous error
SHUT_DOWN_MESSAGE = (
    "Horovod has been shut down. This was caused by a rank calling shutdown() or exiting, an "
    "exception on one of the ranks, or an attempt to run a collective after one of the ranks "
    "finished execution."
)


def _set_bits(bits):
    while bits:
        low = bits & -bits
        yield low.bit_length() - 1
        bits ^= low


ENGINE_TIMER_SLACK_NS = 1000
PR_SET_TIMERSLACK = 29  # prctl(2)


def _precise_timed_waits():
    """Let the calling thread's timed waits end within 1 us of their time. Linux lets them end up
    to the thread's timer slack late, 50 us by default, which spaced the polls of the ranks'
    agreement (_exchange: sleeps from 20 us) 90 to 170 us apart; with 1 us a small allreduce's
    round trip at 2 ranks took 212-229 us instead of 328-336 (measured on 2 cores, where
    ResNet-18's training at 2 ranks ran as fast as before). Elsewhere than on Linux the waits stay
    as they are."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, ENGINE_TIMER_SLACK_NS, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl in this C library: the default slack stays
        pass


def engine_core(affinity, local_rank, local_size):
    """The core HOROVOD_THREAD_AFFINITY (`affinity`, one core a local rank) binds this rank's
    engine thread to, as Horovod binds its background thread; None without it. ValueError where
    it names fewer cores than the host has ranks, or a core this process may not run on."""
    if not affinity:
        return None
    listed = ",".join(map(str, affinity))
    if len(affinity) < local_size:
        raise ValueError(f"environment variable HOROVOD_THREAD_AFFINITY={listed!r} names {len(affinity)} cores, "
                         f"one for each local rank, but this host has {local_size} ranks")
    core, allowed = affinity[local_rank], os.sched_getaffinity(0)
    if core not in allowed:
        raise ValueError(f"environment variable HOROVOD_THREAD_AFFINITY={listed!r}: core {core}, local rank "
                         f"{local_rank}'s, is not among the cores this process may run on "
                         f"({','.join(map(str, sorted(allowed)))})")
    return core


class Engine:
    def __init__(self, comm, settings, members=None, core=None):
        """`members`: the job's rank of each rank of `comm`, where `comm` holds a process set
        (process_sets.py). Errors and a broadcast's root name ranks that way. `core`: a process
        set's engine thread is bound where the job's is (engine_core)."""
        self.settings = settings
        self.topology, self._world, self._local, self._cross = discover(comm)
        self.core = (engine_core(settings.thread_affinity, self.topology.local_rank, self.topology.local_size)
                     if members is None else core)
        self.rank, self.size = self.topology.rank, self.topology.size
        self.members = tuple(range(self.size)) if members is None else members
        self._position = {job_rank: rank for rank, job_rank in enumerate(self.members)}  # a broadcast's root
        self._job_rank = self.members[self.rank]
        self._host_backend: Backend = MpiBackend(self._world, settings)
        # "NCCL" or "MPI" -> a backend for device buffers, made at first use
        self._device_backends: Dict[str, Backend] = {}
        self._device_checked_at = 0.0
        self._cache = ResponseCache(settings.cache_capacity)
        self._coordinator = Coordinator(self.members, settings) if self.rank == 0 else None
        self._timeline = None
        if settings.timeline_path:
            self.start_timeline(settings.timeline_path, settings.timeline_mark_cycles)

        # Submitting threads check and describe their collectives themselves (submission.py).
        self._submissions = submissions = Submissions(self.size, self.members, settings, is_world=members is None,
                                                      topology=self.topology, hurry=self.hurry)
        self.auto_name, self._prepare = submissions.auto_name, submissions.prepare
        self.adasum_refusal = submissions.adasum_refusal
        self._lock = threading.Lock()
        self._submitted = collections.deque()
        self._in_flight = set()
        self._refused = {}  # name -> handle of this rank's latest refusal of that name
        self._pending = {}  # name -> Entry; touched only by the engine thread
        self._hit_plans = {}  # ready cache bits -> (cache version, plan, names)
        self._join_entry = None
        self._stop_requested = False
        self._stopped_error = None

        # Held by the thread running a cycle: the engine's own, or a caller waiting on a result (hurry)
        self._cycling = threading.Lock()
        self._caller_cycle = None  # (start, result) of the latest cycle a caller ran, until the engine thread sees it
        self._wake = threading.Event()  # set by submissions: ends an idle engine's wait early
        self._woken_at = 0.0
        self._hurried = threading.Event()  # set by a caller blocked on a handle: ends the wait for more
        self._thread = threading.Thread(target=self._run, name="hvdtrain-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- submission (any thread)

    def submit(self, kind, array=None, *, name=None, output=None, op=ReduceOp.SUM, prescale=1.0,
               postscale=1.0, root=0, splits=None, bucket=None, stream=None, allocate=None) -> Handle:
        """Queue one collective on host (NumPy) or device (CuPy) buffers. `output` None means:
        the engine allocates the result (allgather, alltoall, reducescatter) or writes into
        `array` (allreduce, broadcast). `output is array` is an in-place operation. Device
        buffers only: `stream`, the caller's CUDA stream (default: CuPy's current one), and
        `allocate(shape, dtype)`, which makes an output the engine cannot size in advance."""
        if name is None:
            name = self.auto_name(kind)
        try:
            entry = self._prepare(kind, array, name, output, op, prescale, postscale, root, splits, bucket, stream,
                                  allocate)
        except REFUSALS as refusal:
            self._announce_refusal(kind, [name], refusal)
            raise
        self._enqueue([entry])
        return entry.handle

    def submit_group(self, kind, arrays, *, name=None, outputs=None, allocate=None, **options):
        """Queue several collectives at once, so that they are negotiated in one cycle and
        fused together where their dtypes allow. `outputs` and `allocate`: one per array."""
        base = self.auto_name(kind) if name is None else name
        names = [f"{base}_{i}" for i in range(len(arrays))]
        outputs = [None] * len(arrays) if outputs is None else outputs
        allocate = [None] * len(arrays) if allocate is None else allocate
        try:
            entries = [self._prepare(kind, array, entry_name, output, allocate=member_allocate, **options)
                       for entry_name, array, output, member_allocate in zip(names, arrays, outputs, allocate)]
        except REFUSALS as refusal:
            self._announce_refusal(kind, names, refusal)  # a group is refused whole
            raise
        self._enqueue(entries)
        return [entry.handle for entry in entries]

    def _announce_refusal(self, kind, names, refusal):
        """Queue, for collectives this rank refused, requests that fail them on every rank: the
        others may have submitted them (alltoall splits, say, differ by rank) and would wait
        for this rank forever."""
        if not all(isinstance(name, str) and name for name in names):
            return  # a bad name: nothing that the other ranks could have submitted
        entries = [Entry(Request(name, kind, refusal=str(refusal)), Handle(name)) for name in names]
        try:
            self._enqueue(entries)
        except (ValueError, HorovodInternalError):
            pass  # the name is in flight here already, or the engine stopped: the caller's error says enough

    def _enqueue(self, entries):
        """Queue `entries` whole. A name this rank refused stays in flight until every rank has
        seen the refusal; submitting it again waits for that (one coordinator round, as a rule)."""
        refused = None
        with self._lock:
            if self._stopped_error is not None:
                raise HorovodInternalError(self._stopped_error)
            in_flight = self._in_flight
            added = []
            try:
                for entry in entries:
                    request = entry.request
                    if request.kind is JOIN:
                        if self._join_entry is not None or any(e.request.kind is JOIN for e in self._submitted):
                            raise ValueError(f"rank {self._job_rank} called join() while its previous join() is in flight")
                    elif request.name in in_flight:
                        refused = self._refused.get(request.name)
                        if refused is None or refused.poll():
                            raise ValueError(
                                f"a collective named '{request.name}' is already in flight on rank "
                                f"{self._job_rank}; names of operations in flight must be unique"
                            )
                        in_flight.difference_update(added)
                        break
                    else:
                        in_flight.add(request.name)
                        added.append(request.name)
                        if request.refusal:
                            self._refused[request.name] = entry.handle
                else:
                    self._submitted.extend(entries)
            except ValueError:
                in_flight.difference_update(added)  # a group is queued whole or not at all
                raise
        if refused is not None:
            try:
                refused.wait()
            except HorovodInternalError:
                pass
            self._enqueue(entries)
            return
        # Setting an Event costs a lock and a notify; the engine clears it only after a wait,
        # before taking what was submitted, so an entry queued while it is set is not missed.
        if not self._wake.is_set():
            self._woken_at = time.perf_counter()
            self._wake.set()

    def hurry(self, handle):
        """A caller blocks on the result of `handle`: it will submit nothing more until it has it,
        so the next cycle runs now instead of after a cycle time's wait for more tensors to fuse
        (at the end of backward that wait is on the step's critical path).

        In a job of one rank, where the engine thread is between cycles, the caller runs that
        cycle itself: handing it to the engine thread and the result back costs two thread
        wake-ups and GIL hand-overs, nearly all of a small collective's round trip (measured on 2
        cores: 115 us, against 12 us run here), which a training loop bound by the host pays every
        step. With more ranks a cycle waits on the others' agreement anyway, and the engine thread,
        woken by the submission, would follow with a cycle of its own that the other ranks must
        match (measured: the round trip 40 us slower at 2 ranks), so there the engine thread runs it."""
        if self.size == 1 and self._cycling.acquire(blocking=False):
            try:
                self._cycle_on_this_thread()
            finally:
                self._cycling.release()
            if handle.poll():
                return
        if not self._hurried.is_set():
            self._hurried.set()

    def _cycle_on_this_thread(self):
        """One cycle on a caller's thread (hurry), which leaves the caller's CUDA state as it was.
        A cycle that may make this rank's first device backend is left to the engine's thread."""
        if self._stopped_error is not None:
            return
        started = time.perf_counter()
        try:
            if self._device_backends:
                device = next(iter(self._device_backends.values())).device
                with cuda.thread_state_kept(device):
                    self._caller_cycle = started, self._cycle()
            elif not cuda.imported():  # no device buffer was submitted: no device backend to make
                self._caller_cycle = started, self._cycle()
        except _DeviceFailure:  # the engine has stopped with the device's error
            pass
        except Exception as exc:
            self._fail(exc)

    # ---------------------------------------------------------------- lifecycle

    def shutdown(self):
        self._stop_requested = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self.stop_timeline()
        for backend in self._device_backends.values():
            backend.close()
        self._device_backends.clear()

    @property
    def alive(self):
        return self._thread.is_alive()

    def start_timeline(self, path, mark_cycles=False):
        if self.rank != 0:
            return
        try:
            timeline = Timeline(path, mark_cycles)
        except OSError as error:
            raise ValueError(f"cannot write the timeline to {path!r}: {error.strerror}") from None
        old, self._timeline = self._timeline, timeline
        if old is not None:
            old.close()

    def stop_timeline(self):
        timeline, self._timeline = self._timeline, None
        if timeline is not None:
            timeline.close()

    # ---------------------------------------------------------------- the engine thread

    def _run(self):
        # A busy engine cycles every cycle time, so that tensors submitted meanwhile are fused.
        # An idle one (nothing pending on any rank) waits longer and longer, up to
        # IDLE_WAIT_S, for a submission of its own: every cycle costs each rank CPU time taken
        # from its training thread (measured: a 1 ms cycle kept idle slowed ResNet-50's
        # forward and backward on one core per rank by 20 %). Waking late costs nothing, since
        # no collective completes before this rank submits its part, which wakes it.
        cycle_time = self.settings.cycle_time_s
        wait = cycle_time
        if self.core is not None:
            os.sched_setaffinity(0, {self.core})  # on Linux, 0 is the calling thread
        _precise_timed_waits()
        try:
            while True:
                hurried = self._hurried.is_set()
                self._hurried.clear()
                with self._cycling:
                    caller_cycle, self._caller_cycle = self._caller_cycle, None
                    if self._stopped_error is not None:  # by a cycle on a caller's thread (hurry)
                        busy = None
                    elif caller_cycle is not None and not hurried:
                        # A caller ran a cycle since this thread's last: the next is due a cycle
                        # time after it, as after one of this thread's, so that what was submitted
                        # since still waits that long for more tensors to fuse.
                        started, busy = caller_cycle
                    else:
                        started = time.perf_counter()
                        busy = self._cycle()
                if busy is None:
                    return
                if busy:
                    wait = cycle_time
                    remaining = cycle_time - (time.perf_counter() - started)
                    if remaining > 0:
                        self._hurried.wait(remaining)
                else:
                    wait = min(2 * wait, max(IDLE_WAIT_S, cycle_time))
                    if self._wake.wait(wait):
                        # A step submits many tensors: let them come for one cycle time, counted
                        # from the first submission, since this thread may get the GIL only after
                        # the submitting thread is done.
                        remaining = self._woken_at + cycle_time - time.perf_counter()
                        if remaining > 0:
                            self._hurried.wait(remaining)
                self._wake.clear()
        except _DeviceFailure:  # the engine has stopped with the device's error; peers see theirs
            return
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc):
        """A bug or a transport failure in a cycle: stop, and never leave peers hanging."""
        message = f"hvdtrain engine failed on rank {self._job_rank}: {exc!r}"
        self._stop(message)
        print(f"{message}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if self.size > 1:
            self._world.Abort(1)

    def _cycle(self):
        """One negotiation and execution round. Returns None once the engine has stopped, else
        whether it is busy: tensors wait here, or some rank asked for a coordinator round, or
        tensors were reduced (more usually follow)."""
        timeline = self._timeline
        if timeline is not None:
            timeline.cycle_start(time.perf_counter())
        if self._device_backends:
            self._check_device_work()
        submitted, pending = self._submitted, self._pending
        while submitted:
            entry = submitted.popleft()
            request = entry.request
            if request.kind is JOIN:
                self._join_entry = entry
            else:
                pending[request.name] = entry

        hits, uncached = self._classify()
        flags = 0
        if uncached or (self._join_entry is not None and not self._join_entry.sent_to_coordinator) or (
            self._coordinator is not None and self._coordinator.stall_check_due()
        ):
            flags |= _WANTS_ROUND
        if self._join_entry is not None:
            flags |= _JOINED
        if self._stop_requested:
            flags |= _SHUTDOWN
        ready_hits, flags = self._exchange(hits, flags)
        if flags & _SHUTDOWN:
            self._stop(SHUT_DOWN_MESSAGE)
            return None

        if ready_hits:
            self._run_plan(self._plan_of_hits(ready_hits), time.perf_counter())

        if flags & (_WANTS_ROUND | _JOINED):
            some_rank_joined = bool(flags & _JOINED)
            to_send = [e for e in self._pending.values() if not e.sent_to_coordinator]
            if not some_rank_joined:
                uncached_names = {e.name for e in uncached}
                to_send = [e for e in to_send if e.name in uncached_names]
            if self._join_entry is not None and not self._join_entry.sent_to_coordinator:
                to_send.append(self._join_entry)
            for entry in to_send:
                entry.sent_to_coordinator = True
            result = self._coordinator_round([(e.request, e.age()) for e in to_send])
            for name in result.evictions:
                self._cache.evict(name)
            if result.shutdown_message:
                self._stop(result.shutdown_message)
                return None
            ready_at = time.perf_counter()
            if not some_rank_joined:  # a joined rank has no request of its own to cache
                for response in result.responses:
                    if cacheable(response):
                        local = self._pending.get(response.name)
                        self._cache.put(response.request if local is None else local.request, response)
            self._run_plan(self._plan(result.responses), ready_at)
        return bool(self._pending or ready_hits or flags) or self._join_entry is not None

    def _classify(self):
        """Bits of the cached responses this rank has ready, and the entries the coordinator
        must see: new names, changed requests, and cached ones that have waited too long
        (so that the stall inspector can name the ranks missing them)."""
        cached_as = self._cache.get
        stale_after = self.settings.stall_check_time_s if self.settings.stall_check_enabled else float("inf")
        submitted_before = time.perf_counter() - stale_after
        hits = 0
        uncached = []
        for entry in self._pending.values():
            if entry.sent_to_coordinator:
                continue
            request = entry.request
            cached = cached_as(request.name)
            # A remembered request is the very object the cache holds: `is` settles most.
            if (cached is not None and (cached.request is request or cached.request == request)
                    and entry.submitted_at > submitted_before):
                hits |= 1 << cached.id
            else:
                uncached.append(entry)
        return hits, uncached

    def _exchange(self, hits, flags):
        """AND the hit bits of all ranks; OR their flags (sent inverted, so AND gives OR)."""
        if self.size == 1:
            return hits, flags
        words = (self._cache.id_limit + 63) // 64
        vector = np.empty(words + 1, np.uint64)
        if words:
            vector[:words] = np.frombuffer(hits.to_bytes(words * 8, "little"), np.uint64)
        vector[words] = ~flags & _FLAG_MASK
        from mpi4py import MPI

        request = self._world.Iallreduce(MPI.IN_PLACE, vector, MPI.BAND)
        # Wait without spinning: ranks share cores with their training threads. The agreement
        # completes only once every rank has polled after the last one arrived, and ranks that
        # submitted one step usually arrive within a millisecond or two of each other: poll
        # often that long (a late poll delays the reduction that follows by as much; traced:
        # up to 1 ms of a 40 ms step), then rarely, since a peer may idle for IDLE_WAIT_S.
        delay = 2e-5
        poll_often_until = time.perf_counter() + 2e-3
        while not request.Test():
            time.sleep(delay)
            delay = min(delay * 2, 1e-4 if time.perf_counter() < poll_often_until else 5e-4)
            if self._device_backends:  # a peer whose NCCL failed may never come
                self._check_device_work()
        ready = int.from_bytes(vector[:words].tobytes(), "little") if words else 0
        return ready, ~int(vector[words]) & _FLAG_MASK

    def _coordinator_round(self, to_send):
        gathered = self._world.gather(to_send, root=0)
        result = None
        if self._coordinator is not None:
            result = self._coordinator.run_round(gathered, self._cache.__contains__)
        return self._world.bcast(result, root=0)

    # ---------------------------------------------------------------- execution

    def _plan_of_hits(self, ready_hits):
        """The plan for cached tensors ready everywhere. Training submits the same tensors
        every step, so the plan of a set of cache ids is made once and reused while the
        cache keeps them."""
        cache = self._cache
        version, plan, names = self._hit_plans.get(ready_hits, (None, None, None))
        if version != cache.version:
            responses = [cache.by_id(i).response for i in _set_bits(ready_hits)]
            plan, names = self._plan(responses), [response.name for response in responses]
            if len(self._hit_plans) >= 256:
                self._hit_plans.clear()
            self._hit_plans[ready_hits] = (cache.version, plan, names)
        for name in names:
            cache.touch(name)
        return plan

    def _plan(self, responses):
        """The steps that run agreed responses: allreduces fused into batches of one dtype, op,
        scale and device up to the fusion threshold (fusion.plan_batches), and every other
        response (an error too) on its own, in its place. It depends on the responses alone, so
        every rank makes the same plan."""
        keys = [_fusion_key(response) for response in responses]
        ready = [(key, 0 if key is None else response.request.nbytes) for key, response in zip(keys, responses)]
        steps = []
        for positions in plan_batches(ready, self.settings.fusion_threshold_bytes):
            if keys[positions[0]] is None:
                steps.append(responses[positions[0]])
            else:
                steps.append(_Batch.of([responses[i] for i in positions]))
        return steps

    def _run_plan(self, plan, ready_at):
        for step in plan:
            if step.__class__ is _Batch:
                self._run_allreduces(step, ready_at)
            elif step.error is not None:
                self._fail_response(step)
            elif step.kind == Kind.JOIN:
                self._finish_join(step)
            else:
                self._run_single(step, ready_at)

    def _backend(self, device, kind, op=None) -> Backend:
        """The backend for buffers on `device` ("cpu" or "cuda") and an operation of `kind`.
        A device backend is made when a step first needs it, at the same step of the same plan
        on every rank, since making one is itself collective (NCCL's communicator)."""
        if device == "cpu":
            return self._host_backend
        transport = self.settings.gpu_operations[kind.value]
        if op == ReduceOp.ADASUM:
            # Adasum is no NCCL operation: device buffers go through host memory. As in Horovod,
            # where the allreduce goes through NCCL they are averaged within each host and
            # combined across hosts; through MPI, combined over all ranks.
            transport = ADASUM_WITHIN_HOSTS_FIRST if transport == "NCCL" else "MPI"
        backend = self._device_backends.get(transport)
        if backend is None:
            from .nccl_backend import NcclBackend
            from .staged_backend import HostStagedBackend

            def device_of():
                return self._submissions.device_for(self.topology)

            if transport == "NCCL":
                backend = NcclBackend(self._world, self.settings, device_of)
            else:
                hosts = (self._local, self._cross) if transport == ADASUM_WITHIN_HOSTS_FIRST else None
                backend = HostStagedBackend(self._world, self.settings, device_of, hosts)
            self._device_backends[transport] = backend
        return backend

    def _check_device_work(self):
        """Fail everything with the error of a device backend whose work failed on the device
        (NCCL's asynchronous errors: a peer gone, a network failure)."""
        now = time.perf_counter()
        if now - self._device_checked_at < DEVICE_CHECK_INTERVAL_S:
            return
        self._device_checked_at = now
        try:
            for backend in self._device_backends.values():
                backend.check()
        except HorovodInternalError as error:
            self._stop(str(error))
            raise _DeviceFailure() from error

    def _local_entry(self, response):
        entry = self._pending.get(response.name)
        if entry is None and self._join_entry is None:
            raise HorovodInternalError(f"rank {self._job_rank} was asked to run '{response.name}', which it never submitted")
        return entry

    def _run_allreduces(self, batch, ready_at):
        """Run one fused batch. Tensors of one bucket that lie next to each other form one
        region; the regions come from the agreed requests alone, so that every rank (a joined
        one too, which reduces zeros) makes the same transport calls."""
        responses, groups = batch.responses, batch.regions
        entries = [self._local_entry(response) for response in responses]  # None where this rank joined
        submitted = [entry for entry in entries if entry is not None]
        try:
            backend = self._backend(batch.device, ALLREDUCE, batch.op)
        except HorovodInternalError as error:  # agreed by every rank (nccl_backend.agree_to_start)
            self._finish_all(submitted, error=error)
            return
        backend.start(submitted)
        sources, destinations = [], []
        for group in groups:
            first, last = responses[group[0]].request, responses[group[-1]].request
            entry = entries[group[0]]
            if entry is None:  # this rank has joined: it contributes zeros
                elements = sum(math.prod(responses[i].request.shape) for i in group)
                zeros = backend.zeros(elements, numpy_dtype(first.dtype))
                sources.append(zeros)
                destinations.append(zeros)
            elif first.bucket:
                end = last.offset + math.prod(last.shape)
                region = entry.bucket[first.offset:end]
                sources.append(region)
                destinations.append(region)
            else:
                source = entry.array.reshape(-1)
                sources.append(source)
                destinations.append(source if entry.output is entry.array else entry.output.reshape(-1))
        timeline = self._timeline
        record = None
        started = time.perf_counter()
        if timeline is not None:
            def record(phase, start, end, group_indices):
                for g in group_indices:
                    for i in groups[g]:
                        if entries[i] is not None:
                            timeline.span(ALLREDUCE, entries[i].name, phase, start, end)

        backend.allreduce(sources, destinations, batch.op, batch.prescale, batch.postscale, record)
        done = backend.finish(submitted)
        finished = time.perf_counter()
        if timeline is not None:
            for entry in submitted:
                self._record_lifetime(timeline, entry, ALLREDUCE, ready_at, started, finished)
            timeline.flush()
        self._finish_all(submitted, done)

    def _run_single(self, response, ready_at):
        entry = self._local_entry(response)
        if entry is None:
            return
        request = response.request
        started = time.perf_counter()
        if request.kind == Kind.BARRIER:  # agreeing that every rank reached it was the whole work
            result, done, transport = None, None, "MPI"
        else:
            try:
                backend = self._backend(request.device, request.kind)
            except HorovodInternalError as error:  # agreed by every rank (nccl_backend.agree_to_start)
                self._finish(entry, error=error)
                return
            backend.start((entry,))
            if request.kind == Kind.ALLGATHER:
                result = backend.allgather(entry, response.first_dims)
            elif request.kind == Kind.BROADCAST:
                backend.broadcast(entry, self._position[request.root])
                result = entry.output
            elif request.kind == Kind.ALLTOALL:
                result = backend.alltoall(entry)
            else:
                result = backend.reducescatter(entry, request.op, request.prescale, request.postscale)
            done, transport = backend.finish((entry,)), backend.transport
        finished = time.perf_counter()
        timeline = self._timeline
        if timeline is not None:
            timeline.span(request.kind, entry.name, f"{transport}_{request.kind.value.upper()}", started, finished)
            self._record_lifetime(timeline, entry, request.kind, ready_at, started, finished)
            timeline.flush()
        self._finish(entry, result, done=done)

    @staticmethod
    def _record_lifetime(timeline, entry, kind, ready_at, started, finished):
        submitted, name, operation = entry.submitted_at, entry.name, kind.value.upper()
        timeline.span(kind, name, f"NEGOTIATE_{operation}", submitted, max(submitted, ready_at))
        timeline.span(kind, name, operation, ready_at, finished)
        timeline.span(kind, name, "QUEUE", ready_at, started)

    def _finish(self, entry, result=None, error=None, done=None):
        self._pending.pop(entry.name, None)
        with self._lock:
            self._in_flight.discard(entry.name)
        entry.handle._finish(result, error, done)

    def _finish_all(self, entries, done=None, error=None):
        """Finish allreduces (their result is their output), taking the lock once."""
        pending = self._pending
        for entry in entries:
            del pending[entry.request.name]
        with self._lock:
            self._in_flight.difference_update(entry.request.name for entry in entries)
        for entry in entries:
            entry.handle._finish(None if error else entry.output, error, done)

    def _fail_response(self, response):
        entry = self._pending.get(response.name)
        if entry is None:
            return  # a joined rank: the error belongs to the ranks that submitted the tensor
        if response.error_values is not None:
            error = TensorMismatchError(response.error, response.name, response.error_field, response.error_values)
        else:
            error = HorovodInternalError(response.error)
        self._finish(entry, error=error)

    def _finish_join(self, response):
        entry, self._join_entry = self._join_entry, None
        entry.handle._finish(response.last_joined_rank)

    def _stop(self, message):
        """Fail everything pending or queued with `message`; refuse new work."""
        with self._lock:
            self._stopped_error = message
            queued = list(self._submitted)
            self._submitted.clear()
        entries = itertools.chain(self._pending.values(), queued, [self._join_entry] if self._join_entry else [])
        for entry in list(entries):
            self._finish(entry, error=HorovodInternalError(message))
        self._join_entry = None
        if message != SHUT_DOWN_MESSAGE:
            log.error(message)


def _fusion_key(response):
    """What allreduces must share to run in one fused batch; None for a response that runs on
    its own (another collective, or an error)."""
    if response.error is not None or response.kind is not ALLREDUCE:
        return None
    request = response.request
    return request.dtype, request.op, request.prescale, request.postscale, request.device


def _regions(requests):
    """Group batch positions into regions reduced as one: runs of tensors adjacent in the same
    bucket (in bucket order), then every other tensor alone (in batch order)."""
    in_buckets = sorted((r.bucket, r.offset, i) for i, r in enumerate(requests) if r.bucket)
    regions = []
    previous_end = None
    for bucket, offset, i in in_buckets:
        if regions and previous_end == (bucket, offset):
            regions[-1].append(i)
        else:
            regions.append([i])
        previous_end = (bucket, offset + math.prod(requests[i].shape))
    regions.extend([i] for i, r in enumerate(requests) if not r.bucket)
    return regions


class _DeviceFailure(Exception):
    """Ends the engine's thread after a device backend's failure has stopped the engine."""


@dataclass(frozen=True)
class _Batch:
    """Allreduces fused into one run: same dtype, op, scale factors and device."""

    responses: tuple
    regions: tuple  # groups of positions in `responses` reduced as one memory region
    op: ReduceOp
    prescale: float
    postscale: float
    device: str

    @classmethod
    def of(cls, responses):
        request = responses[0].request
        if request.op == ReduceOp.ADASUM:  # combined tensor by tensor, never as one region
            regions = tuple((i,) for i in range(len(responses)))
        else:
            regions = tuple(tuple(group) for group in _regions([r.request for r in responses]))
        return cls(tuple(responses), regions, request.op, request.prescale, request.postscale, request.device)
