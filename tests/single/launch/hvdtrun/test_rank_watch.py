"""hvdtrun's watch over the ranks' connections (hvdtrain/launch/hvdtrun/rank_watch.py), with
sockets of this process standing in for the ranks: which ranks it finds not ended after the job,
and the reports it still takes once the job has ended. The real jobs:
tests/parallel/launch/hvdtrun/test_command.py and tests/cluster/test_cluster_failure.py."""

import socket
import threading

import pytest

from hvdtrain.launch.hvdtrun import rank_watch
from hvdtrain.run.hosts import Host


@pytest.fixture
def watch():
    opened = rank_watch.open_rank_watch([Host("localhost", 3)], [], world_size=3, timeout_s=30, verbose=False)
    yield opened
    opened.close()


def report(watch, rank):
    """A rank's side: the connection that reported `rank`, left open."""
    connection = socket.create_connection(("127.0.0.1", watch.listener.getsockname()[1]))
    connection.sendall(f"{rank}\n".encode())
    return connection


def ended_job(watch):
    """The job ends at once; the watch takes what reports have come."""
    rank_watch.job_ended(watch, rank_watch.start_watching(watch))


def test_a_rank_whose_connection_closed_has_ended(watch):
    ranks = [report(watch, rank) for rank in range(3)]
    ended_job(watch)
    for connection in ranks:
        connection.close()
    assert rank_watch.ranks_not_ended(watch, grace_s=5) == {}


def test_a_rank_whose_connection_stays_open_has_not_ended_and_is_named_by_its_address(watch):
    ranks = [report(watch, rank) for rank in range(3)]
    ended_job(watch)
    ranks[0].close()
    ranks[2].close()
    assert rank_watch.ranks_not_ended(watch, grace_s=0.2) == {1: "127.0.0.1"}
    ranks[1].close()


def test_a_rank_that_never_reported_is_named_as_never_started(watch):
    ranks = [report(watch, rank) for rank in (0, 2)]
    ended_job(watch)
    for connection in ranks:
        connection.close()
    assert rank_watch.ranks_not_ended(watch, grace_s=5) == {1: None}


def test_reports_still_queued_when_the_job_ends_are_taken(watch):
    ranks = [report(watch, rank) for rank in range(3)]  # before the watch accepts any
    watch.job_ended.set()
    rank_watch.watch_start(watch, threading.get_ident())
    assert sorted(watch.connections) == [0, 1, 2]
    assert watch.missing is None
    for connection in ranks:
        connection.close()


def test_ranks_past_the_limit_of_open_files_are_not_watched_for_their_end(watch):
    watch.held_limit = 2
    ranks = [report(watch, rank) for rank in range(3)]
    ended_job(watch)
    assert (len(watch.connections), len(watch.unwatched)) == (2, 1)
    for connection in ranks:
        connection.close()
    assert rank_watch.ranks_not_ended(watch, grace_s=5) == {}


def test_the_limit_of_open_files_is_raised_for_a_job_that_needs_more(monkeypatch):
    limits = {"now": (1024, 65536)}
    monkeypatch.setattr(rank_watch.resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(rank_watch.resource, "setrlimit", lambda which, value: limits.update(now=value))
    assert rank_watch.held_connections_limit(4096) == 4096
    assert limits["now"] == (4096 + rank_watch.SPARE_DESCRIPTORS, 65536)


def test_past_the_hard_limit_of_open_files_the_watch_holds_what_it_can(monkeypatch):
    limits = {"now": (1024, 2048)}
    monkeypatch.setattr(rank_watch.resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(rank_watch.resource, "setrlimit", lambda which, value: limits.update(now=value))
    assert rank_watch.held_connections_limit(4096) == 2048 - rank_watch.SPARE_DESCRIPTORS
