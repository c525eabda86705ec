"""The two parts of negotiation (hvdtrain/core/negotiation.py) on their own, in this process: the
ResponseCache (least recently used eviction, ids that every rank assigns alike, capacity 0) and
the Coordinator (a response once every rank has submitted, allgather rows, each mismatched field
named with the ranks, join bookkeeping, stall reports and the stall shutdown). Out-of-order
submission on real ranks is in tests/parallel/core/test_negotiation.py."""

import random
import time

import pytest

from hvdtrain.core import ReduceOp
from hvdtrain.core.negotiation import Coordinator, ResponseCache
from hvdtrain.core.requests import Kind, Request
from hvdtrain.core.settings import Settings


def request(name, shape=(2,), **fields):
    return Request(name, fields.pop("kind", Kind.ALLREDUCE), fields.pop("dtype", "float32"), shape, **fields)


# ----------------------------------------------------------------------------- ResponseCache


def cache_with(capacity, names):
    cache = ResponseCache(capacity)
    for name in names:
        cache.put(request(name), f"response {name}")
    return cache


def test_cache_evicts_the_least_recently_used_and_reuses_its_id():
    cache = cache_with(3, "abc")
    cache.put(request("a"), "response a again")  # a is now the most recent
    cache.put(request("d"), "response d")
    assert "b" not in cache and [n in cache for n in "acd"] == [True] * 3
    assert (cache.get("d").id, cache.id_limit) == (1, 3)  # b's id, and no new one
    assert cache.by_id(0).response == "response a again"
    cache.put(request("e"), "response e")  # c is now the least recent
    assert "c" not in cache and cache.get("e").id == 2


def test_cache_gives_the_lowest_free_id():
    cache = cache_with(10, "abcde")
    cache.evict("d")
    cache.evict("b")
    cache.evict("missing")
    cache.put(request("f"), "f")
    cache.put(request("g"), "g")
    cache.put(request("h"), "h")
    assert [cache.get(n).id for n in "fgh"] == [1, 3, 5]
    assert len(cache) == 6 and cache.id_limit == 6


def test_caches_fed_alike_assign_alike_ids_whatever_the_local_requests():
    """Ranks put their own requests (an allgather's rows differ per rank); the ids, which every
    rank's bit vector indexes, must still agree."""
    rng = random.Random(5)
    operations = [(rng.choice("ppe"), f"t{rng.randrange(12)}") for _ in range(400)]
    caches = [ResponseCache(5), ResponseCache(5)]
    for rank, cache in enumerate(caches):
        for operation, name in operations:
            if operation == "p":
                cache.put(request(name, shape=(rank + 1, 3), kind=Kind.ALLGATHER), name)
            else:
                cache.evict(name)
    layouts = [{name: cache.get(name).id for name in (f"t{i}" for i in range(12)) if name in cache} for cache in caches]
    assert layouts[0] == layouts[1] and caches[0].id_limit == caches[1].id_limit == 5
    assert len(layouts[0]) >= 4, layouts  # full, but for a trailing eviction or two


def test_cache_of_capacity_zero_holds_nothing():
    cache = cache_with(0, "abc")
    assert len(cache) == 0 and cache.id_limit == 0 and cache.get("a") is None


# ----------------------------------------------------------------------------- Coordinator


def coordinator(size, **settings):
    return Coordinator(tuple(range(size)), Settings(**settings))


def test_coordinator_responds_once_every_rank_has_submitted():
    coord = coordinator(3)
    x = request("x")
    result = coord.run_round([[(x, 0.0)], [(x, 0.0)], []], lambda name: False)
    assert result.responses == [] and result.evictions == []
    result = coord.run_round([[], [], [(x, 0.0), (request("y"), 0.0)]], lambda name: False)
    assert [(r.name, r.error) for r in result.responses] == [("x", None)]
    assert result.responses[0].request == x
    result = coord.run_round([[(request("y"), 0.0)], [(request("y"), 0.0)], []], lambda name: False)
    assert [r.name for r in result.responses] == ["y"]


def test_coordinator_collects_the_rows_of_an_allgather_and_evicts_cached_names():
    coord = coordinator(2)
    gathered = [[(request("g", shape=(r * 3, 2), kind=Kind.ALLGATHER), 0.0)] for r in range(2)]
    result = coord.run_round(gathered, lambda name: name == "g")
    assert result.evictions == ["g"]
    assert result.responses[0].first_dims == (0, 3) and result.responses[0].error is None


MISMATCHES = [  # (field, what rank 1 submits differently, its value in the message)
    ("operation", {"kind": Kind.BROADCAST}, "broadcast"),
    ("dtype", {"dtype": "float64"}, "float64"),
    ("device", {"device": "cuda"}, "cuda"),  # the same name in host memory here, on a GPU there
    ("shape", {"shape": (3,)}, "(3,)"),
    ("op", {"op": ReduceOp.MAX}, "MAX"),
    ("prescale_factor", {"prescale": 0.5}, "0.5"),
    ("postscale_factor", {"postscale": 2.0}, "2.0"),
]


@pytest.mark.parametrize("field, differently, shown", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_coordinator_names_the_mismatched_field_and_the_ranks(field, differently, shown):
    coord = coordinator(3)
    agreed = request("w", op=ReduceOp.SUM)
    odd = agreed._replace(**differently)
    result = coord.run_round([[(agreed, 0.0)], [(odd, 0.0)], [(agreed, 0.0)]], lambda name: False)
    (response,) = result.responses
    assert response.error_field == field
    assert set(response.error_values) == {0, 1, 2} and response.error_values[0] == response.error_values[2]
    assert response.error_values[0] != response.error_values[1]
    assert f"Mismatched {field} for collective 'w'" in response.error, response.error
    assert f"rank 1: {shown}" in response.error and "ranks 0, 2: " in response.error, response.error


def test_coordinator_names_a_mismatched_broadcast_root():
    coord = coordinator(2)
    gathered = [[(request("b", kind=Kind.BROADCAST, root=r), 0.0)] for r in range(2)]
    (response,) = coord.run_round(gathered, lambda name: False).responses
    assert response.error_field == "root_rank" and "rank 0: 0; rank 1: 1" in response.error, response.error


def test_coordinator_join_bookkeeping():
    coord = coordinator(3)
    x, join = request("x"), request("join", kind=Kind.JOIN)
    result = coord.run_round([[], [(join, 0.0)], []], lambda name: False)
    assert result.responses == []
    # Rank 1 has joined: x is ready once ranks 0 and 2 have it.
    result = coord.run_round([[(x, 0.0)], [], [(x, 0.0)]], lambda name: False)
    assert [r.name for r in result.responses] == ["x"] and result.responses[0].error is None
    # Other kinds cannot run while a rank has joined.
    b = request("b", kind=Kind.BROADCAST)
    (response,) = coord.run_round([[(b, 0.0)], [], [(b, 0.0)]], lambda name: False).responses
    assert response.error_field == "join" and "[1]" in response.error, response.error
    result = coord.run_round([[(join, 0.0)], [], []], lambda name: False)
    assert result.responses == []
    (response,) = coord.run_round([[], [], [(join, 0.0)]], lambda name: False).responses
    assert (response.kind, response.last_joined_rank) == (Kind.JOIN, 2)
    # A new round of joins starts from nobody.
    assert coord.run_round([[(join, 0.0)], [], []], lambda name: False).responses == []
    (response,) = coord.run_round([[], [(join, 0.0)], [(join, 0.0)]], lambda name: False).responses
    assert response.last_joined_rank == 2


def test_coordinator_reports_a_stall_and_then_shuts_down(caplog):
    coord = coordinator(3, stall_check_time_s=0.05, stall_shutdown_time_s=5.0)
    time.sleep(0.06)
    result = coord.run_round([[(request("s"), 1.0)], [], []], lambda name: False)
    assert result.shutdown_message is None
    assert "rank 1 has not submitted ['s']; rank 2 has not submitted ['s']" in caplog.text, caplog.text
    time.sleep(0.06)
    result = coord.run_round([[], [], [(request("s"), 6.0)]], lambda name: False)
    assert result.shutdown_message and "rank 1 has not submitted ['s']" in result.shutdown_message
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=5" in result.shutdown_message, result.shutdown_message


def test_coordinator_waits_a_round_before_judging_a_name_just_evicted(caplog):
    """A cached tensor gone stale on rank 0 reaches the coordinator a cycle before rank 1's copy
    (which waited on the cache path until the eviction): rank 1 is not missing it."""
    coord = coordinator(3, stall_check_time_s=0.05)
    time.sleep(0.06)
    result = coord.run_round([[(request("c"), 1.0)], [], []], lambda name: name == "c")
    assert result.evictions == ["c"] and "Stall" not in caplog.text, caplog.text
    time.sleep(0.06)
    coord.run_round([[], [(request("c"), 1.0)], []], lambda name: False)
    assert "rank 2 has not submitted ['c']" in caplog.text and "rank 1 has not" not in caplog.text, caplog.text
