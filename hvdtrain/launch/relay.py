"""MPI ranks started through the processes of another engine (Ray actors, Spark tasks), not ssh.

Ray and Spark already run a process of theirs on each host they chose for a job: an actor, a
task. Each such process holds a RankRelay, and mpirun, on the driver, reaches every host through
the relay of one of them: Open MPI calls its remote agent (plm_ssh_agent) as `AGENT HOST COMMAND`
where it would call ssh, and our agent (`python -m hvdtrain.launch.relay agent`) asks HOST's
relay to run COMMAND (Open MPI's daemon) there, passing back its output and exit status as ssh
would. The ranks mpirun starts run `python -m hvdtrain.launch.relay rank`: each connects to the
relay of its own actor or task and runs there, in a real MPI rank, the functions that the actor or
task receives. So the engine chooses the hosts and holds the resources, and MPI runs the job.

A relay runs commands it is sent, so every connection is authenticated with a key that only the
driver and its processes know (multiprocessing's HMAC handshake).
"""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, OrderedDict
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import cloudpickle

from hvdtrain.launch import mpirun
from hvdtrain.run.hosts import Host

KEY_VARIABLE = "HVDTRAIN_RELAY_KEY"
RELAYS_VARIABLE = "HVDTRAIN_RANK_RELAYS"  # the relay of each rank, in rank order
# The relay the agent reaches each host through, as HOST=RELAY,...: in the agent's environment,
# not its command line, which Open MPI splits at commas and colons (it lists alternative agents).
HOST_RELAYS_VARIABLE = "HVDTRAIN_HOST_RELAYS"
AGENT_CONNECTION_FAILED = 255  # what ssh exits with when it cannot reach the host
STOP_GRACE_S = 5.0
# In a rank's process: its link to its relay, and the lock that keeps two threads' messages whole.
_to_relay: Optional[Tuple[Connection, threading.Lock]] = None


class RankFailed(RuntimeError):
    """A rank raised, or ended, while running a function it was sent; the message names the rank
    and its host."""


class RankEnded(RankFailed):
    """A rank ended before it answered: killed, or stopped by the job because another rank failed."""


def raised_by_the_function(error):
    """Whether `error`, which ended a call, is the error of the function the ranks ran (or of
    their executable), which a restart would meet again; not a rank that ended (killed, or its
    peers lost) or anything else that ended the call."""
    return isinstance(error, RankFailed) and not isinstance(error, RankEnded)


class RankSeat(NamedTuple):
    """Where a rank will run: its host (the address mpirun is given) and the relay of its process."""
    host: str
    relay: str


def _address(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


class RankRelay:
    """The relay of one rank, held by the engine's process (actor, task) on the rank's host."""

    def __init__(self, host_address: str, key: bytes):
        self._listener = Listener((host_address, 0), family="AF_INET", authkey=key)
        self.address = "%s:%d" % self._listener.address
        self._rank_links: "queue.Queue" = queue.Queue()
        self._commands: List[subprocess.Popen] = []
        self._closed = False
        self.rank: Optional[int] = None
        self.rank_environment: Dict[str, str] = {}
        self._link = None
        threading.Thread(target=self._accept, name="hvdtrain-relay", daemon=True).start()

    def expect(self, rank: int, environment: Optional[Dict[str, str]] = None):
        """This relay serves `rank`, whose process gets `environment` before it runs anything
        (what the engine gave the host's processes: their GPUs; the user's variables), as do the
        commands it runs (Open MPI's daemon, whose ranks inherit it)."""
        self.rank = rank
        self.rank_environment = dict(environment or {})

    def _accept(self):
        while not self._closed:
            try:
                connection = self._listener.accept()
            except (AuthenticationError, EOFError, ConnectionError):
                continue  # a stranger, or a peer that went away during the handshake
            except OSError:
                return  # the listener was closed
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        try:
            kind, payload = connection.recv()
        except (EOFError, OSError):
            connection.close()
            return
        if kind == "run":
            self._run_command(connection, payload)
        elif kind == "rank":
            self._rank_links.put((payload, connection))
        else:
            connection.close()

    def _run_command(self, connection, words):
        """Run a command as sshd would (its words joined and given to the shell), with this
        Python's and mpirun's folders first on PATH; stream its output back; stop it when the
        agent goes away (mpirun stops a daemon by ending its agent)."""
        env = {**os.environ, **self.rank_environment}
        folders = [os.path.dirname(sys.executable), os.path.dirname(mpirun.mpirun_executable())]
        env["PATH"] = os.pathsep.join(folders + [env.get("PATH", "")])
        process = subprocess.Popen(["/bin/sh", "-c", " ".join(words)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                   start_new_session=True)
        self._commands.append(process)
        sending = threading.Lock()

        def pump(stream, kind):
            try:
                for chunk in iter(lambda: stream.read1(65536), b""):
                    with sending:
                        connection.send((kind, chunk))
            except OSError:
                pass  # the agent went away; _stop_when_gone stops the command

        pumps = [threading.Thread(target=pump, args=(process.stdout, "out"), daemon=True),
                 threading.Thread(target=pump, args=(process.stderr, "err"), daemon=True)]
        for thread in pumps:
            thread.start()
        threading.Thread(target=self._stop_when_gone, args=(connection, process), daemon=True).start()
        try:
            for thread in pumps:
                thread.join()
            code = process.wait()
            with sending:
                connection.send(("exit", code))
        except OSError:
            pass  # as above
        finally:
            connection.close()

    @staticmethod
    def _stop_when_gone(connection, process):
        try:
            connection.recv()  # the agent never sends after its request: this returns when it goes
        except (EOFError, OSError):
            pass
        _stop_group(process)

    def _rank_link(self, timeout_s):
        if self._link is None:
            try:
                rank, link = self._rank_links.get(timeout=timeout_s)
            except queue.Empty:
                raise RankFailed(f"rank {self.rank} ({self.address}) did not start within {timeout_s:g} s") from None
            if rank != self.rank:
                link.close()
                raise RankFailed(f"rank {rank} reached the relay of rank {self.rank} ({self.address}): "
                                 "mpirun placed the ranks otherwise than asked")
            link.send(("environment", self.rank_environment))
            self._link = link
        return self._link

    def call(self, kind: str, payload, timeout_s: float, on_sent: Optional[Callable[[Any], None]] = None):
        """Have the rank run `payload` (kind "start": (class, args, kwargs), whose instance it
        keeps; kind "execute": a function of that instance, None before any start) and return
        the result; RankFailed if it raises or ends. What the rank sends meanwhile
        (send_to_caller) goes to `on_sent`, in order; its first error is raised once the rank
        has answered, so that the link stays in step."""
        link = self._rank_link(timeout_s)
        failed = None
        try:
            link.send((kind, cloudpickle.dumps(payload)))
            while (answer := link.recv())[0] == "sent":
                try:
                    if on_sent is not None:
                        on_sent(cloudpickle.loads(answer[1]))
                except Exception as error:  # raised below, after the answer
                    failed = failed or error
        except (EOFError, OSError):
            self._link = None
            raise RankEnded(f"rank {self.rank} ({self.address}) ended before it answered; "
                             "the job's output says why") from None
        if answer[0] == "ok":
            if failed is not None:
                raise failed
            return cloudpickle.loads(answer[1])
        _, error, text = answer
        raise RankFailed(f"rank {self.rank} ({self.address}) failed: {text}") from error

    def close(self, wait_s: float = 0.0):
        """Let the rank end, wait up to `wait_s` for the commands this relay started (the host's
        Open MPI daemon ends when the job does), then stop what is left."""
        self._closed = True
        if self._link is not None:
            try:
                self._link.send(("stop", None))
            except OSError:
                pass
            self._link.close()
        self._listener.close()
        deadline = time.monotonic() + wait_s
        for process in self._commands:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop_group(process)


def _stop_group(process):
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass


def host_by_host(hosts: Sequence[str]) -> List[int]:
    """The indices of `hosts` in rank order, as mpirun numbers ranks: host by host, hosts in the
    order of their first appearance, and each host's own in their order."""
    first: Dict[str, int] = {}
    for host in hosts:
        first.setdefault(host, len(first))
    return sorted(range(len(hosts)), key=lambda index: (first[hosts[index]], index))


def rank_hosts(seats: Sequence[RankSeat]) -> List[Host]:
    """The hosts for mpirun, in rank order; ranks of one host must be consecutive, as mpirun
    numbers them host by host."""
    hosts: "OrderedDict[str, int]" = OrderedDict()
    for index, seat in enumerate(seats):
        if seat.host in hosts and seats[index - 1].host != seat.host:
            raise ValueError(f"the ranks of host {seat.host} are not consecutive: {[s.host for s in seats]}")
        hosts[seat.host] = hosts.get(seat.host, 0) + 1
    return [Host(host, slots) for host, slots in hosts.items()]


def relayed(seats: Sequence[RankSeat], key: bytes, env: Dict[str, str]) -> Tuple[List[Host], List[str]]:
    """The hosts and the mpirun arguments that reach each host through the relay of its first
    rank; `env`, mpirun's environment, gets what the agent needs."""
    first_relay = {}
    for seat in seats:
        first_relay.setdefault(seat.host, seat.relay)
    env[KEY_VARIABLE] = key.hex()
    env[HOST_RELAYS_VARIABLE] = ",".join(f"{host}={relay}" for host, relay in first_relay.items())
    # mpirun itself starts every daemon (no tree spawn): the agent needs the environment given here.
    return rank_hosts(seats), ["--mca", "plm_ssh_agent", f"{sys.executable} -m {__name__} agent",
                               "--mca", "plm_ssh_no_tree_spawn", "1"]


def mpirun_job(seats: Sequence[RankSeat], key: bytes, env: Optional[Dict[str, str]] = None,
               extra_mpi_args: Sequence[str] = ()) -> Tuple[List[str], Dict[str, str]]:
    """The mpirun command and environment that start one rank for each seat, each of which runs
    what the relay of its seat sends it."""
    env = mpirun.worker_environment(max(Counter(seat.host for seat in seats).values()), base=env)
    hosts, relay_args = relayed(seats, key, env)
    env[RELAYS_VARIABLE] = ",".join(seat.relay for seat in seats)
    command = mpirun.mpirun_command([sys.executable, "-m", __name__, "rank"], hosts=hosts, env=env,
                                    extra_args=[*relay_args, *extra_mpi_args])
    return command, env


def agent(host: str, *words: str) -> int:
    """Open MPI's remote agent: run `words` on `host` through its relay, as `ssh host words`."""
    relays = dict(item.split("=", 1) for item in os.environ[HOST_RELAYS_VARIABLE].split(","))
    if host not in relays:
        print(f"hvdtrain relay agent: no relay for host {host!r} (relays: {', '.join(relays)})", file=sys.stderr)
        return AGENT_CONNECTION_FAILED
    try:
        connection = Client(_address(relays[host]), family="AF_INET", authkey=bytes.fromhex(os.environ[KEY_VARIABLE]))
        connection.send(("run", list(words)))
        while True:
            kind, data = connection.recv()
            if kind == "exit":
                return data
            stream = sys.stdout if kind == "out" else sys.stderr
            stream.buffer.write(data)
            stream.flush()
    except (OSError, EOFError, AuthenticationError) as error:
        print(f"hvdtrain relay agent: the relay of host {host} ({relays[host]}) went away: {error}", file=sys.stderr)
        return AGENT_CONNECTION_FAILED


def send_to_caller(value) -> bool:
    """In a rank started through a relay, while it runs a call: send `value` to the caller (the
    relay's `call` hands it to its `on_sent`). False in any other process."""
    if _to_relay is None:
        return False
    _send(("sent", cloudpickle.dumps(value)))
    return True


def _send(message):
    """`message` up this rank's link, whole, whichever thread sends it."""
    link, sending = _to_relay
    with sending:
        link.send(message)


def rank() -> int:
    """A rank: connect to this rank's relay, then run what it sends until it says stop or goes."""
    global _to_relay
    rank_number = int(os.environ["OMPI_COMM_WORLD_RANK"])
    relay = os.environ[RELAYS_VARIABLE].split(",")[rank_number]
    link = Client(_address(relay), family="AF_INET", authkey=bytes.fromhex(os.environ[KEY_VARIABLE]))
    _to_relay = link, threading.Lock()
    link.send(("rank", rank_number))
    executable = None
    while True:
        try:
            kind, payload = link.recv()
        except (EOFError, OSError):
            return 0  # the relay went: the job is over
        if kind == "stop":
            return 0
        if kind == "environment":
            os.environ.update(payload)
            continue
        try:
            function = cloudpickle.loads(payload)
            if kind == "start":
                cls, args, kwargs = function
                executable = cls(*args, **kwargs) if cls is not None else None
                result = None
            else:
                result = function(executable)
            _send(("ok", cloudpickle.dumps(result)))
        except Exception as error:  # the function's error goes to the caller, with the rank's traceback
            text = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
            try:
                _send(("error", error, text))
            except Exception:  # an error that does not pickle travels as its text
                _send(("error", None, text))


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["agent"] and len(argv) >= 2:
        return agent(*argv[1:])
    if argv == ["rank"]:
        return rank()
    print("usage: python -m hvdtrain.launch.relay agent HOST COMMAND... | rank", file=sys.stderr)
    return 2


if __name__ == "__main__":
    # Run as the module the rank's functions import (send_to_caller's link lives there), not as
    # this copy of it named __main__.
    from hvdtrain.launch import relay

    sys.exit(relay.main(sys.argv[1:]))
