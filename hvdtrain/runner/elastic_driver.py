"""hvdtrun's elastic mode: `hvdtrun --host-discovery-script S [--min-np N] [--max-np M] ...`.

MPI cannot change a running job's members, so hvdtrun keeps a Horovod Elastic script going by
starting its job again (the script's side: hvdtrain/core/elastic.py):
- hvdtrun runs the discovery script (lines `HOST` or `HOST:SLOTS`, `--slots-per-host` where a
  line gives none) before each start and once a second while the job runs;
- it starts the job on as many slots as there are, up to --max-np, once there are --min-np
  (waiting up to --elastic-timeout for them);
- it keeps the commit store the ranks' `state.commit()` sends their state to, and the version of
  the hosts: when discovery finds other hosts, the version goes up, the ranks learn it at their
  next commit and end the job with EXIT_HOSTS_UPDATED, and hvdtrun starts it on the new hosts;
- a job that fails in a way a start can fix (a rank killed, its peers lost: anything but the
  script's own error, exit 3, or a bad command, exit 2) is started again from the last commit;
- every start after the first counts against --reset-limit.
"""

import os
import shlex
import socketserver
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Optional

from hvdtrain.core.elastic import EXIT_HOSTS_UPDATED, HOSTS_VERSION_VARIABLE, STORE_VARIABLE
from hvdtrain.runner import launcher
from hvdtrain.runner.supervisor import EXIT_CONFIG, EXIT_RANK_ERROR

DISCOVERY_INTERVAL_S = 1.0  # Horovod's
DISCOVERY_TIMEOUT_S = 30.0
NOT_RESTARTED = {EXIT_CONFIG: "the command was refused",
                 EXIT_RANK_ERROR: "the script raised an error that a restart would meet again"}


@dataclass(frozen=True)
class ElasticOptions:
    discovery_script: str
    min_np: int
    max_np: Optional[int]
    slots_per_host: int
    reset_limit: Optional[int]
    elastic_timeout_s: float


class DiscoveryError(Exception):
    """The discovery script failed or printed something that is not a host."""


def discover(options):
    """The hosts the discovery script prints now, in its order."""
    try:
        result = subprocess.run(shlex.split(options.discovery_script), capture_output=True, text=True,
                                timeout=DISCOVERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DiscoveryError(f"the host discovery script {options.discovery_script!r} cannot run: {error}") from None
    if result.returncode != 0:
        raise DiscoveryError(f"the host discovery script {options.discovery_script!r} exited with status "
                             f"{result.returncode}: {result.stderr.strip()}")
    hosts = []
    for line in result.stdout.split():
        name, _, slots = line.partition(":")
        if not name or (slots and not slots.isdigit()):
            raise DiscoveryError(f"the host discovery script printed {line!r}: lines must be HOST or HOST:SLOTS")
        hosts.append(launcher.Host(name, int(slots) if slots else options.slots_per_host))
    return hosts


def placed(hosts, num_proc):
    """The hosts' slots filled in order with `num_proc` ranks (hosts left without one dropped)."""
    taken, left = [], num_proc
    for host in hosts:
        if left <= 0:
            break
        taken.append(launcher.Host(host.host, min(host.slots, left)))
        left -= taken[-1].slots
    return taken


class CommitStore(socketserver.ThreadingTCPServer):
    """The ranks' last commit (rank 0 sends it) and the version of the hosts, over TCP: one
    request per connection (PUT n + n bytes, GET, VERSION), answered OK, DATA n + n bytes, NONE
    or VERSION v."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("", 0), _StoreRequest)
        self.commit, self.hosts_version = None, 0
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _StoreRequest(socketserver.StreamRequestHandler):
    def handle(self):
        store = self.server
        words = self.rfile.readline().decode().split()
        if words[:1] == ["PUT"]:
            store.commit = self.rfile.read(int(words[1]))
            self.wfile.write(b"OK 0\n")
        elif words[:1] == ["GET"]:
            commit = store.commit
            self.wfile.write(b"NONE 0\n" if commit is None else b"DATA %d\n" % len(commit) + commit)
        elif words[:1] == ["VERSION"]:
            self.wfile.write(b"VERSION %d\n" % store.hosts_version)


def watch_hosts(options, store, launched, stop):
    """While the job runs: raise the hosts' version once when discovery finds hosts other than
    those the job was started with (the ranks then stop at their next commit)."""
    while not stop.wait(DISCOVERY_INTERVAL_S):
        try:
            found = discover(options)
        except DiscoveryError as error:
            print(f"hvdtrun: {error}; the job goes on on its hosts", file=sys.stderr, flush=True)
            continue
        if found != launched:
            store.hosts_version += 1
            print(f"hvdtrun: the hosts changed to {format_hosts(found)}; the job starts again on them at its "
                  f"next commit", file=sys.stderr, flush=True)
            return


def hosts_for_a_start(options, deadline):
    """The discovered hosts once they have --min-np slots, waiting until `deadline`."""
    while True:
        hosts = discover(options)
        if sum(host.slots for host in hosts) >= options.min_np:
            return hosts
        if time.monotonic() >= deadline:
            raise DiscoveryError(f"the discovery script found {sum(h.slots for h in hosts)} slots "
                                 f"({format_hosts(hosts) or 'no hosts'}), fewer than --min-np {options.min_np}, "
                                 f"for the whole --elastic-timeout")
        time.sleep(DISCOVERY_INTERVAL_S)


def format_hosts(hosts):
    return ",".join(f"{host.host}:{host.slots}" for host in hosts)


def run_elastic(options, elastic, start_job, addresses):
    """Start and restart the job as the module says; returns hvdtrun's exit status.
    `start_job(options, hosts)` runs one job (hvdtrun's launch: the start timeout, Ctrl-C) and
    returns its status; the ranks reach the commit store at this machine's `addresses`."""
    store = CommitStore()
    store_address = ",".join(["127.0.0.1", *addresses]) + f":{store.server_address[1]}"
    resets = 0
    try:
        while True:
            try:
                hosts = hosts_for_a_start(elastic, time.monotonic() + elastic.elastic_timeout_s)
            except DiscoveryError as error:
                print(f"hvdtrun: {error}", file=sys.stderr, flush=True)
                return 1
            slots = sum(host.slots for host in hosts)
            num_proc = min(slots, elastic.max_np or slots)
            job_hosts = placed(hosts, num_proc)
            os.environ[STORE_VARIABLE] = store_address  # the ranks' environment is hvdtrun's
            os.environ[HOSTS_VERSION_VARIABLE] = str(store.hosts_version)
            stop = threading.Event()
            threading.Thread(target=watch_hosts, args=(elastic, store, hosts, stop), daemon=True).start()
            try:
                status = start_job(replace(options, num_proc=num_proc), job_hosts)
            finally:
                stop.set()
            if status == 0:
                return 0
            if status in NOT_RESTARTED or status == 130:
                if status in NOT_RESTARTED:
                    print(f"hvdtrun: the job failed (exit status {status}): {NOT_RESTARTED[status]}, so it is not "
                          f"started again", file=sys.stderr, flush=True)
                return status
            resets += 1
            why = "the hosts changed" if status == EXIT_HOSTS_UPDATED else f"the job failed (exit status {status})"
            if elastic.reset_limit is not None and resets > elastic.reset_limit:
                print(f"hvdtrun: {why}; it has been started again {resets - 1} times (--reset-limit "
                      f"{elastic.reset_limit}), so it stops here", file=sys.stderr, flush=True)
                return status or 1
            print(f"hvdtrun: {why}; starting it again from its last commit (reset {resets})", file=sys.stderr,
                  flush=True)
    finally:
        store.shutdown()
        store.server_close()

