"""hvdtrun's side of the connection each rank opens to it (rank_start.py is the rank's side): did
every rank start within the start timeout, and, once mpirun has ended, did every rank's process
end?

A rank connects as it starts and says its number; the connection then stays open through the
exec into the user's command, so that the rank's own kernel closes it when the process ends,
however it ends. The second question matters because Open MPI 5's mpirun has ended with status 0
after losing a host mid-run (tests/cluster/test_cluster_failure.py), which would report a job cut
short as done: a connection still open after mpirun has ended is a rank that did not end through
mpirun.
"""

import fcntl
import resource
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

from hvdtrain.run.hosts import all_on_this_machine

SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address
# How long the last ranks' connections may take to close once mpirun has ended. Their processes
# have ended by then, but what they forked holds the connection too: PyTorch's DataLoader workers
# of a rank that ended with os._exit notice it within 5 s (their watchdog's interval). Waiting
# costs only a job that failed so; a connection that closes ends the wait.
END_GRACE_S = 30.0
# How often the watch looks up from waiting for reports to see whether the job has ended.
POLL_S = 0.2
# Descriptors hvdtrun keeps for everything but the ranks' connections (MPI's pipes, the store's).
SPARE_DESCRIPTORS = 256


def interface_addresses(names):
    """The IPv4 addresses of this machine's interfaces (only those in `names`, if any), loopback
    left out: where ranks on other hosts may reach hvdtrun."""
    addresses = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            if names and name not in names:
                continue
            try:
                request = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # the interface has no IPv4 address
            address = socket.inet_ntoa(request[20:24])
            if not address.startswith("127."):
                addresses.append(address)
    return addresses


def held_connections_limit(world_size):
    """How many ranks' connections hvdtrun can hold open: its soft limit of open files raised to
    the hard one where the job needs more, less what it keeps for the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < world_size + SPARE_DESCRIPTORS:
        soft = hard if hard == resource.RLIM_INFINITY else min(hard, world_size + SPARE_DESCRIPTORS)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return world_size if soft == resource.RLIM_INFINITY else max(0, soft - SPARE_DESCRIPTORS)


@dataclass
class RankWatch:
    """The socket the ranks report to, the addresses they may reach it at, and what came of it."""
    listener: socket.socket
    addresses: List[str]
    world_size: int
    timeout_s: int
    verbose: bool
    held_limit: int  # ranks whose connection is held; any beyond are not watched for their end
    lock: threading.Lock = field(default_factory=threading.Lock)
    job_ended: threading.Event = field(default_factory=threading.Event)
    missing: Optional[List[int]] = None  # the ranks that had not started when time ran out
    connections: Dict[int, socket.socket] = field(default_factory=dict)  # rank -> its open connection
    unwatched: Set[int] = field(default_factory=set)  # started, but past held_limit

    def close(self):
        for connection in self.connections.values():
            connection.close()
        self.listener.close()


def listening_address(hosts, network_interfaces):
    """(the address for a socket of hvdtrun's to listen at, the addresses the ranks may reach it
    at): this machine's loopback when every rank runs here, else all its interfaces (`hosts`
    None: not known before the job starts)."""
    if hosts is not None and all_on_this_machine(hosts):
        return "127.0.0.1", ["127.0.0.1"]
    # The interfaces named for MPI's traffic where this machine has them; under other names here
    # (a bridge to the other hosts' eth0, say), any of its interfaces.
    addresses = interface_addresses(network_interfaces) or interface_addresses([])
    if not addresses:
        raise ValueError("this machine has no IPv4 address but loopback, where ranks on other hosts could reach it")
    return "", addresses


def open_rank_watch(hosts, network_interfaces, world_size, timeout_s, verbose):
    """A RankWatch listening where the ranks on `hosts` can reach it."""
    host, addresses = listening_address(hosts, network_interfaces)
    listener = socket.create_server((host, 0), backlog=min(world_size, 4096))
    return RankWatch(listener, addresses, world_size, timeout_s, verbose, held_connections_limit(world_size))


def _take_report(watch, connection, timeout_s):
    try:
        connection.settimeout(timeout_s)
        rank = int(connection.recv(64).decode())
    except (OSError, ValueError):
        connection.close()  # not a rank's report
        return
    if len(watch.connections) < watch.held_limit:
        watch.connections[rank] = connection
    else:
        watch.unwatched.add(rank)
        connection.close()


def _started(watch):
    return len(watch.connections) + len(watch.unwatched)


def _not_started(watch):
    return sorted(set(range(watch.world_size)) - set(watch.connections) - watch.unwatched)


def watch_start(watch, main_thread_id):
    """Collects the ranks' reports until all have come or the job has ended (then those waiting
    in the listener's queue too); when the start timeout runs out first, stops the job as Ctrl-C
    does (mpirun.run stops all of it on KeyboardInterrupt)."""
    started_at = time.monotonic()
    deadline = started_at + watch.timeout_s
    while _started(watch) < watch.world_size and not watch.job_ended.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        watch.listener.settimeout(min(remaining, POLL_S))
        try:
            connection, _ = watch.listener.accept()
        except socket.timeout:
            continue
        except OSError:
            return  # the listener was closed
        _take_report(watch, connection, remaining)
    if watch.job_ended.is_set():
        # Ranks that reported just before the job ended are still in the listener's queue.
        watch.listener.setblocking(False)
        while _started(watch) < watch.world_size:
            try:
                connection, _ = watch.listener.accept()
            except OSError:
                return
            _take_report(watch, connection, POLL_S)
        return
    if _started(watch) == watch.world_size:
        if watch.verbose:
            print(f"hvdtrun: all {watch.world_size} ranks started in {time.monotonic() - started_at:.1f} s",
                  file=sys.stderr, flush=True)
        return
    with watch.lock:
        if not watch.job_ended.is_set():
            watch.missing = _not_started(watch)
            signal.pthread_kill(main_thread_id, signal.SIGINT)


def start_watching(watch):
    thread = threading.Thread(target=watch_start, args=(watch, threading.get_ident()), daemon=True)
    thread.start()
    return thread


def job_ended(watch, thread):
    """Marks the job as ended (the start timeout no longer stops it) and waits for the watch to
    take the reports still queued."""
    with watch.lock:
        watch.job_ended.set()
    thread.join()


def ranks_not_ended(watch, grace_s=None):
    """{rank: the address it connected from, or None where it never reported} for the ranks that
    had not started, or whose connection is still open `grace_s` (END_GRACE_S) after the job
    ended."""
    grace_s = END_GRACE_S if grace_s is None else grace_s
    open_ranks = dict(watch.connections)
    deadline = time.monotonic() + grace_s
    with selectors.DefaultSelector() as selector:  # epoll: select() stops at descriptor 1023
        for rank, connection in open_ranks.items():
            connection.setblocking(False)
            selector.register(connection, selectors.EVENT_READ, rank)
        while open_ranks:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in selector.select(remaining):
                try:
                    closed = key.fileobj.recv(4096) == b""
                except BlockingIOError:
                    closed = False
                except OSError:  # reset by the rank's host: its end of the connection is gone
                    closed = True
                if closed:
                    selector.unregister(key.fileobj)
                    del open_ranks[key.data]
    found = dict.fromkeys(_not_started(watch))
    for rank, connection in open_ranks.items():
        try:
            found[rank] = connection.getpeername()[0]
        except OSError:
            found[rank] = None
    return dict(sorted(found.items()))


def describe_ranks(ranks, shown=8):
    ranks = list(ranks)
    listed = ", ".join(map(str, ranks[:shown]))
    return listed + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")
