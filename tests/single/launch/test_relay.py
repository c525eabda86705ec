"""The relay that Ray actors and Spark tasks hold for their ranks (hvdtrain/launch/relay.py): the
agent that mpirun calls in place of ssh, and the link to the rank. Jobs through relays, across
hosts: tests/cluster/test_ray.py, tests/cluster/test_spark.py, tests/integration/spark/."""

import os
import secrets
import subprocess
import sys
import time
from multiprocessing.connection import Client

import cloudpickle
import pytest

from hvdtrain.launch import relay as relays
from hvdtrain.launch.relay import RankEnded, RankFailed, RankRelay, RankSeat
from hvdtrain.run.hosts import Host

KEY = secrets.token_bytes(32)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the rank cannot import this module


@pytest.fixture
def relay():
    held = RankRelay("127.0.0.1", KEY)
    yield held
    held.close()


def run_agent(host, command, relay_address, key=KEY, **options):
    env = dict(os.environ, **{relays.KEY_VARIABLE: key.hex(), relays.HOST_RELAYS_VARIABLE: f"hostA={relay_address}"})
    return subprocess.run([sys.executable, "-m", "hvdtrain.launch.relay", "agent", host, *command], env=env,
                          capture_output=True, text=True, timeout=60, **options)


def test_the_agent_runs_the_command_on_the_host_as_ssh_would(relay):
    done = run_agent("hostA", ["echo", "out;", "echo", "err", ">&2;", "exit", "7"], relay.address)
    assert (done.stdout, done.stderr, done.returncode) == ("out\n", "err\n", 7)


def test_the_command_runs_with_the_environment_the_engine_gave_the_host(relay):
    relay.expect(0, {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert run_agent("hostA", ["echo", "$CUDA_VISIBLE_DEVICES"], relay.address).stdout == "2,3\n"


def test_the_agent_for_a_host_without_a_relay_fails_as_ssh_does_naming_it(relay):
    done = run_agent("hostB", ["true"], relay.address)
    assert done.returncode == relays.AGENT_CONNECTION_FAILED
    assert "no relay for host 'hostB' (relays: hostA)" in done.stderr


def test_a_peer_without_the_key_is_refused_and_the_relay_serves_on(relay):
    done = run_agent("hostA", ["echo", "never"], relay.address, key=secrets.token_bytes(32))
    assert done.returncode == relays.AGENT_CONNECTION_FAILED and done.stdout == ""
    assert run_agent("hostA", ["echo", "served"], relay.address).stdout == "served\n"


def test_the_command_stops_when_its_agent_goes(relay, tmp_path):
    marker = tmp_path / "pid"
    agent = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.relay", "agent", "hostA", "echo", "$$", ">",
                              str(marker), ";", "exec", "sleep", "60"],
                             env=dict(os.environ, **{relays.KEY_VARIABLE: KEY.hex(),
                                                     relays.HOST_RELAYS_VARIABLE: f"hostA={relay.address}"}))
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    command_pid = int(marker.read_text())
    agent.kill()
    agent.wait()
    deadline = time.monotonic() + 10
    while _alive(command_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(command_pid)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return False


@pytest.fixture
def rank_process(relay):
    """A rank's program for rank 0 of a job whose one relay is `relay` (as mpirun starts it)."""
    env = dict(os.environ, OMPI_COMM_WORLD_RANK="0",
               **{relays.KEY_VARIABLE: KEY.hex(), relays.RELAYS_VARIABLE: relay.address})
    process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.relay", "rank"], env=env)
    yield process
    process.kill()
    process.wait()


class Greeter:
    def __init__(self, greeting, name="rank"):
        self.text = f"{greeting}, {name}"


def test_the_rank_runs_what_its_relay_sends_and_keeps_the_instance(relay, rank_process):
    relay.expect(0, {"HVDTRAIN_TEST_GIVEN": "by the engine"})
    relay.call("start", (Greeter, ["hello"], {"name": "zero"}), timeout_s=60)
    assert relay.call("execute", lambda greeter: greeter.text, timeout_s=60) == "hello, zero"
    assert relay.call("execute", lambda _: os.environ["HVDTRAIN_TEST_GIVEN"], timeout_s=60) == "by the engine"


def test_an_error_in_the_rank_is_raised_naming_the_rank_with_its_traceback(relay, rank_process):
    relay.expect(0)

    def fails(_):
        raise KeyError("missing on purpose")

    with pytest.raises(RankFailed, match=r"rank 0 \(127\.0\.0\.1:\d+\) failed: KeyError: 'missing on purpose'\n"
                                         r"Traceback") as raised:
        relay.call("execute", fails, timeout_s=60)
    assert isinstance(raised.value.__cause__, KeyError)
    assert relay.call("execute", lambda _: "still serving", timeout_s=60) == "still serving"


def sends_three_then_answers(_):
    for number in range(3):
        assert relays.send_to_caller({"number": number})
    return "answered"


def test_what_the_rank_sends_during_a_call_reaches_the_callers_handler_in_order(relay, rank_process):
    relay.expect(0)
    received = []
    assert relay.call("execute", sends_three_then_answers, timeout_s=60, on_sent=received.append) == "answered"
    assert received == [{"number": 0}, {"number": 1}, {"number": 2}]


def test_a_handlers_error_is_raised_after_the_answer_and_the_relay_serves_on(relay, rank_process):
    relay.expect(0)

    def refuses(value):
        raise ValueError(f"handler refuses {value}")

    with pytest.raises(ValueError, match=r"handler refuses \{'number': 0\}"):
        relay.call("execute", sends_three_then_answers, timeout_s=60, on_sent=refuses)
    assert relay.call("execute", lambda _: "still in step", timeout_s=60) == "still in step"


def test_a_process_that_is_no_relays_rank_sends_nothing():
    assert relays.send_to_caller("to nobody") is False


def test_a_rank_that_ends_while_running_a_call_is_reported_as_ended(relay, rank_process):
    relay.expect(0)
    with pytest.raises(RankEnded, match=r"rank 0 \(127\.0\.0\.1:\d+\) ended before it answered"):
        relay.call("execute", lambda _: os._exit(3), timeout_s=60)


def test_a_rank_that_never_starts_is_reported_within_the_timeout(relay):
    relay.expect(0)
    with pytest.raises(RankFailed, match=r"rank 0 \(127\.0\.0\.1:\d+\) did not start within 0\.5 s"):
        relay.call("execute", lambda _: None, timeout_s=0.5)


def test_a_rank_at_the_relay_of_another_is_refused(relay):
    relay.expect(1)
    link = Client(("127.0.0.1", int(relay.address.rpartition(":")[2])), family="AF_INET", authkey=KEY)
    link.send(("rank", 0))
    with pytest.raises(RankFailed, match=r"rank 0 reached the relay of rank 1 .*placed the ranks otherwise"):
        relay.call("execute", lambda _: None, timeout_s=10)


def test_the_hosts_for_mpirun_are_the_seats_host_by_host():
    seats = [RankSeat("a", "a:1"), RankSeat("a", "a:2"), RankSeat("b", "b:1")]
    assert relays.rank_hosts(seats) == [Host("a", 2), Host("b", 1)]


def test_seats_whose_hosts_are_not_consecutive_are_refused():
    with pytest.raises(ValueError, match=r"the ranks of host a are not consecutive: \['a', 'b', 'a'\]"):
        relays.rank_hosts([RankSeat("a", "a:1"), RankSeat("b", "b:1"), RankSeat("a", "a:2")])


def test_mpirun_reaches_each_host_through_the_relay_of_its_first_rank():
    seats = [RankSeat("a", "a:1"), RankSeat("a", "a:2"), RankSeat("b", "b:1")]
    command, env = relays.mpirun_job(seats, KEY, env={}, extra_mpi_args=["--mca", "btl", "self,tcp"])
    assert env[relays.HOST_RELAYS_VARIABLE] == "a=a:1,b=b:1"
    assert env[relays.RELAYS_VARIABLE] == "a:1,a:2,b:1"
    assert env[relays.KEY_VARIABLE] == KEY.hex()
    agent = command[command.index("plm_ssh_agent") + 1]
    assert agent == f"{sys.executable} -m hvdtrain.launch.relay agent"
    assert command[command.index("-H") + 1] == "a:2,b:1"
    assert command[-4:] == [sys.executable, "-m", "hvdtrain.launch.relay", "rank"]
