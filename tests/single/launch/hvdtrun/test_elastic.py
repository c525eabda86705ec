"""hvdtrun's elastic driver (hvdtrain/launch/hvdtrun/elastic.py) around a stand-in for the job:
after a failure (also mpirun's status 0 before hvd.elastic.run returned), a host that does not
answer is blacklisted and the job starts again without it, for good or for a cooldown that
doubles between the bounds of --blacklist-cooldown-range, as Horovod's; a change of hosts
blacklists nothing. The real jobs: tests/integration/launch/hvdtrun/
and tests/cluster/test_cluster_failure.py."""

import pytest

from hvdtrain.launch.hvdtrun import elastic
from hvdtrain.run.hosts import Host


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_host_is_blacklisted_for_good_without_a_cooldown_range():
    clock = Clock()
    blacklist = elastic.Blacklist(clock=clock)
    assert blacklist.add("b") == "for good"
    clock.now += 10 ** 9
    assert blacklist.without([Host("a", 1), Host("b", 2)]) == [Host("a", 1)]


def test_a_cooldown_doubles_with_each_blacklisting_within_its_bounds(monkeypatch):
    monkeypatch.setattr(elastic.random, "uniform", lambda low, high: high)  # the most Horovod adds at random
    clock = Clock()
    blacklist = elastic.Blacklist((10, 60), clock=clock)
    hosts = [Host("b", 1)]
    assert [blacklist.add("b") for _ in range(3)] == ["for 30 s", "for 50 s", "for 60 s"]  # 2x, 4x, 8x 10 s + 10 s
    clock.now += 59
    assert blacklist.without(hosts) == []
    clock.now += 1
    assert blacklist.without(hosts) == hosts


def _driver(tmp_path, statuses, answer, elastic_timeout_s=5):
    """Run the driver on the hosts a:1 and b:1 with jobs that end with `statuses` in turn (or
    call them, for a status), the hosts that answer being `answer`; returns the hosts of each
    start and what was asked."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho a:1\necho b:1\n")
    script.chmod(0o755)
    options = elastic.ElasticOptions(str(script), min_np=1, max_np=None, slots_per_host=1, reset_limit=None,
                                     elastic_timeout_s=elastic_timeout_s)
    starts, asked = [], []

    def start_job(num_proc, hosts):
        starts.append(hosts)
        status = statuses[len(starts) - 1]
        return status() if callable(status) else status

    def answering(hosts):
        asked.append(hosts)
        return [host for host in hosts if host.host in answer]

    return elastic.run_elastic(options, start_job, [], answering), starts, asked


def test_a_host_that_does_not_answer_after_a_failure_is_left_out(tmp_path, capsys):
    status, starts, asked = _driver(tmp_path, [137, 0], answer={"a"})
    assert status == 0
    assert starts == [[Host("a", 1), Host("b", 1)], [Host("a", 1)]]
    assert asked == [[Host("a", 1), Host("b", 1)]]
    assert "hvdtrun: host b does not answer; it is blacklisted for good" in capsys.readouterr().err


def test_a_failure_where_every_host_answers_starts_on_them_all_again(tmp_path):
    status, starts, _ = _driver(tmp_path, [137, 0], answer={"a", "b"})
    assert status == 0 and starts[1] == [Host("a", 1), Host("b", 1)]


def test_a_change_of_hosts_asks_no_host(tmp_path):
    status, starts, asked = _driver(tmp_path, [elastic.EXIT_HOSTS_UPDATED, 0], answer=set())
    assert status == 0 and len(starts) == 2 and asked == []


def test_a_job_whose_every_host_is_blacklisted_ends_naming_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(elastic, "DISCOVERY_INTERVAL_S", 0.1)
    status, starts, _ = _driver(tmp_path, [137], answer=set(), elastic_timeout_s=0.5)
    assert status == 1 and len(starts) == 1
    assert ("hvdtrun: the discovery script found 0 slots (no hosts), and blacklisted a:1,b:1, fewer than --min-np 1, "
            "for the whole --elastic-timeout") in capsys.readouterr().err


@pytest.fixture(autouse=True)
def no_environment_left_behind(monkeypatch):
    """The driver sets the ranks' variables in its own environment, as hvdtrun's ranks inherit it."""
    for name in (elastic.STORE_VARIABLE, elastic.HOSTS_VERSION_VARIABLE, "HOROVOD_ELASTIC"):
        monkeypatch.setenv(name, "")  # so that undoing it all removes what the driver set
        monkeypatch.delenv(name)


def test_a_job_ended_with_status_0_before_its_elastic_run_returned_is_started_again(tmp_path, capsys):
    """What mpirun does when it loses a host: it may end with status 0 (Open MPI 5, seen in
    tests/cluster/test_cluster_failure.py)."""
    from hvdtrain.core.elastic import commit_store

    def lost_mid_run():  # rank 0's hvd.elastic.run began (its GET) and never returned
        commit_store().get()
        return 0

    def finished():
        store = commit_store()
        store.get()
        store.returned()
        return 0

    status, starts, asked = _driver(tmp_path, [lost_mid_run, finished], answer={"a"})
    assert status == 0 and starts[1] == [Host("a", 1)] and len(asked) == 1
    said = capsys.readouterr().err
    assert "hvdtrun: mpirun ended with status 0, but hvd.elastic.run had not returned on rank 0" in said


def test_a_ranks_own_error_ends_the_job_whatever_status_mpirun_counted_first(tmp_path, capsys):
    """A rank whose function raised tells the store before it exits with 3; its peer, aborted by
    MPI itself on losing it, may be the one whose status mpirun ends with (14 on the cluster)."""
    from hvdtrain.core.elastic import commit_store

    def raised_on_a_rank():
        commit_store().failed(3)
        return 14

    status, starts, _ = _driver(tmp_path, [raised_on_a_rank, 0], answer={"a", "b"})
    assert status == 3 and len(starts) == 1
    assert "hvdtrun: the job failed (exit status 3): a rank raised an error" in capsys.readouterr().err


def test_fixed_hosts_are_found_as_given_and_the_blacklisted_left_out(capsys):
    options = elastic.ElasticOptions(None, min_np=1, max_np=None, slots_per_host=1, reset_limit=None,
                                     elastic_timeout_s=5, fixed_hosts=(Host("a", 2), Host("b", 2)))
    starts = []

    def start_job(num_proc, hosts):
        starts.append((num_proc, hosts))
        return 137 if len(starts) == 1 else 0

    status = elastic.run_elastic(options, start_job, [], lambda hosts: [host for host in hosts if host.host == "a"])
    assert status == 0
    assert starts == [(4, [Host("a", 2), Host("b", 2)]), (2, [Host("a", 2)])]
    assert "hvdtrun: host b does not answer; it is blacklisted for good" in capsys.readouterr().err
