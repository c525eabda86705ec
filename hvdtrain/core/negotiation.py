"""Agreeing, across ranks, which collectives are ready and in which order to run them.

Two paths, as in Horovod:
- The steady state: a tensor that ran before is in the response cache, which is identical on
  every rank because every rank applies the same puts, touches and evictions in the same
  order. A rank marks the cache ids it has pending in a bit vector; one bitwise-AND
  allreduce of those vectors tells every rank which cached tensors are ready everywhere.
- Anything else (a new tensor, a changed shape, a rank that joined, a stall) goes through
  the coordinator on rank 0, which gathers requests, checks that ranks agree, and broadcasts
  the responses. A cached name seen by the coordinator is evicted everywhere, so a tensor is
  never half on one path and half on the other.
"""

import collections
import heapq
import logging
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .requests import RAGGED_KINDS, REDUCING_KINDS, Kind, Request, Response

log = logging.getLogger("hvdtrain.core")

CACHEABLE_KINDS = frozenset((Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.ALLTOALL, Kind.REDUCESCATTER))
AUTO_NAME_MARK = ".noname."  # in the names the engine makes up for unnamed collectives


def cacheable(response):
    """Whether a response is worth caching: named collectives recur every step; a barrier,
    or a collective the engine named itself, never recurs and would only crowd the cache."""
    return response.error is None and response.kind in CACHEABLE_KINDS and AUTO_NAME_MARK not in response.name


@dataclass
class CacheEntry:
    id: int
    request: Request  # this rank's request when the response was made
    response: Response


class ResponseCache:
    """Least-recently-used cache of responses, keyed by tensor name, with small integer ids
    that index the bit vector."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._by_name: "collections.OrderedDict[str, CacheEntry]" = collections.OrderedDict()
        self._by_id: Dict[int, CacheEntry] = {}
        self._free_ids: List[int] = []
        self.id_limit = 0  # ids in use are < id_limit; the bit vector has this many bits
        self.version = 0  # changes whenever an id in use comes to stand for something else

    def __len__(self):
        return len(self._by_name)

    def __contains__(self, name):
        return name in self._by_name

    def get(self, name) -> Optional[CacheEntry]:
        return self._by_name.get(name)

    def by_id(self, cache_id) -> CacheEntry:
        return self._by_id[cache_id]

    def put(self, request: Request, response: Response):
        if self.capacity == 0:
            return
        entry = self._by_name.get(request.name)
        if entry is not None:
            entry.request, entry.response = request, response
            self._by_name.move_to_end(request.name)
            self.version += 1
            return
        if len(self._by_name) >= self.capacity:
            self.version += 1
            _, lru = self._by_name.popitem(last=False)
            del self._by_id[lru.id]
            heapq.heappush(self._free_ids, lru.id)
        if self._free_ids:
            cache_id = heapq.heappop(self._free_ids)
        else:
            cache_id = self.id_limit
            self.id_limit += 1
        entry = CacheEntry(cache_id, request, response)
        self._by_name[request.name] = entry
        self._by_id[cache_id] = entry

    def touch(self, name):
        """Mark `name` used (for the LRU order) without changing what it stands for."""
        self._by_name.move_to_end(name)

    def evict(self, name):
        entry = self._by_name.pop(name, None)
        if entry is not None:
            self.version += 1
            del self._by_id[entry.id]
            heapq.heappush(self._free_ids, entry.id)


def _describe_by_rank(values_by_rank):
    groups = collections.defaultdict(list)
    for rank, value in sorted(values_by_rank.items()):
        groups[value].append(rank)
    parts = []
    for value, ranks in groups.items():
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{label} {', '.join(map(str, ranks))}: {value}")
    return "; ".join(parts)


def _mismatch(requests_by_rank):
    """The first field on which the ranks disagree, with each rank's value, or None."""
    any_request = next(iter(requests_by_rank.values()))
    checks = [("operation", lambda r: r.kind.value), ("dtype", lambda r: r.dtype), ("device", lambda r: r.device)]
    if any_request.kind in RAGGED_KINDS:
        checks.append(("shape (all but the first dimension)", lambda r: tuple(r.shape[1:])))
        checks.append(("number of dimensions", lambda r: len(r.shape)))
    else:
        checks.append(("shape", lambda r: tuple(r.shape)))
    if any_request.kind == Kind.ALLREDUCE:
        checks.append(("bucket layout (bucket, offset)", lambda r: (r.bucket, r.offset)))
    if any_request.kind in REDUCING_KINDS:
        checks.append(("op", lambda r: r.op.name))
        checks.append(("prescale_factor", lambda r: r.prescale))
        checks.append(("postscale_factor", lambda r: r.postscale))
    if any_request.kind == Kind.BROADCAST:
        checks.append(("root_rank", lambda r: r.root))
    for field_name, value_of in checks:
        values = {rank: value_of(request) for rank, request in requests_by_rank.items()}
        if len(set(values.values())) > 1:
            return field_name, values
    return None


@dataclass
class _Waiting:
    first_seen: float
    requests: Dict[int, Request] = field(default_factory=dict)


@dataclass
class RoundResult:
    evictions: List[str]
    responses: List[Response]
    shutdown_message: Optional[str] = None


class Coordinator:
    """Rank 0's bookkeeping: which ranks submitted which names, who joined, what stalls."""

    def __init__(self, ranks, settings):
        """`ranks`: how messages name the ranks, by their position in the communicator."""
        self.ranks = ranks
        self.size = len(ranks)
        self.settings = settings
        self._table: "collections.OrderedDict[str, _Waiting]" = collections.OrderedDict()
        self._joined: List[int] = []
        self._last_stall_check = time.monotonic()
        self._warned = set()

    def stall_check_due(self):
        if not self.settings.stall_check_enabled or not self._table:
            return False
        interval = min(1.0, self.settings.stall_check_time_s)
        return time.monotonic() - self._last_stall_check >= interval

    def run_round(self, gathered, is_cached) -> RoundResult:
        """`gathered[rank]` is the list of (request, seconds since it was submitted) that
        rank sends; `is_cached(name)` tells whether a name is in the (identical) caches."""
        now = time.monotonic()
        evictions = []
        for rank, submitted in zip(self.ranks, gathered):
            for request, age in submitted:
                if request.kind == Kind.JOIN:
                    if rank not in self._joined:
                        self._joined.append(rank)
                    continue
                if is_cached(request.name) and request.name not in evictions:
                    evictions.append(request.name)
                waiting = self._table.get(request.name)
                if waiting is None:
                    waiting = self._table[request.name] = _Waiting(first_seen=now - age)
                waiting.first_seen = min(waiting.first_seen, now - age)
                waiting.requests[rank] = request

        responses = []
        joined = set(self._joined)
        for name in list(self._table):
            waiting = self._table[name]
            if len(joined.union(waiting.requests)) < self.size:
                continue
            del self._table[name]
            self._warned.discard(name)
            responses.append(self._respond(name, waiting.requests, joined))
        if len(self._joined) == self.size:
            responses.append(Response(name="join", kind=Kind.JOIN, last_joined_rank=self._joined[-1]))
            self._joined = []
        return RoundResult(evictions, responses, self._inspect_stalls(now, evictions))

    def _respond(self, name, requests_by_rank, joined):
        lowest = min(requests_by_rank)
        request = requests_by_rank[lowest]
        refusals = {rank: r.refusal for rank, r in requests_by_rank.items() if r.refusal}
        if refusals:
            reasons = "; ".join(f"rank {rank}: {reason}" for rank, reason in sorted(refusals.items()))
            message = f"{request.kind.value} '{name}' was refused when submitted ({reasons}), so no rank runs it"
            return Response(name, request.kind, request, error=message, error_field="refusal")
        mismatch = _mismatch(requests_by_rank)
        if mismatch is not None:
            field_name, values = mismatch
            message = (
                f"Mismatched {field_name} for collective '{name}' across ranks: "
                f"{_describe_by_rank(values)}. Every rank must submit '{name}' with the same {field_name}."
            )
            return Response(name, request.kind, request, error=message, error_field=field_name, error_values=values)
        if joined and request.kind != Kind.ALLREDUCE:
            message = (
                f"{request.kind.value} '{name}' cannot run while rank(s) {sorted(joined)} have called join(): "
                "only allreduce lets joined ranks take part (they contribute zeros)."
            )
            return Response(name, request.kind, request, error=message, error_field="join")
        first_dims = None
        if request.kind == Kind.ALLGATHER:
            first_dims = tuple(requests_by_rank[r].shape[0] for r in self.ranks)
        return Response(name, request.kind, request, first_dims=first_dims)

    def _inspect_stalls(self, now, evictions):
        settings = self.settings
        if not settings.stall_check_enabled or not self._table:
            return None
        if now - self._last_stall_check < min(1.0, settings.stall_check_time_s):
            return None
        self._last_stall_check = now
        # A name evicted in this round may still wait on the cache path of other ranks, which
        # send it here next cycle: judged now, they would be reported as missing it.
        stalled = [
            (name, w) for name, w in self._table.items()
            if now - w.first_seen >= settings.stall_check_time_s and name not in evictions
        ]
        if not stalled:
            return None
        missing_by_rank = collections.defaultdict(list)
        for name, waiting in stalled:
            for rank in self.ranks:
                if rank not in waiting.requests and rank not in self._joined:
                    missing_by_rank[rank].append(name)
        longest = max(now - w.first_seen for _, w in stalled)
        report = "; ".join(f"rank {r} has not submitted {names}" for r, names in sorted(missing_by_rank.items()))
        new_names = {name for name, _ in stalled} - self._warned
        if new_names:
            self._warned |= new_names
            log.warning(
                "Stall: one or more collectives were submitted by some ranks and have waited %.1f s for the "
                "others (HOROVOD_STALL_CHECK_TIME_SECONDS=%g). %s. Ranks that take different branches or run "
                "different numbers of steps cause this.",
                longest,
                settings.stall_check_time_s,
                report,
            )
        if settings.stall_shutdown_time_s > 0 and longest >= settings.stall_shutdown_time_s:
            return (
                f"Shutting down after a stall of {longest:.1f} s "
                f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={settings.stall_shutdown_time_s:g}): {report}."
            )
        return None
