"""hvdtrun's elastic mode: `hvdtrun --host-discovery-script S [--min-np N] [--max-np M] ...`, or,
as horovodrun takes it, `hvdtrun --min-np N [-H HOSTS | --hostfile F] ...` on fixed hosts.

MPI cannot change a running job's members, so hvdtrun keeps a Horovod Elastic script going by
starting its job again (the script's side: hvdtrain/core/elastic.py):
- hvdtrun runs the discovery script (a host a line, `HOST` or `HOST:SLOTS` as hvdtrain/run/hosts.py
  reads hosts, `--slots-per-host` where a line gives none) before each start and once a second
  while the job runs; fixed hosts are found as they were given, less the blacklisted;
- it starts the job on as many slots as there are, up to --max-np, once there are --min-np
  (waiting up to --elastic-timeout for them);
- it keeps the commit store the ranks' `state.commit()` sends their state to, and the version of
  the hosts: when discovery finds other hosts, the version goes up, the ranks learn it at their
  next commit and end the job with EXIT_HOSTS_UPDATED, and hvdtrun starts it on the new hosts;
- a job that fails in a way a start can fix (a rank killed, its peers lost: anything but what
  hvdtrain/core/exits.py says a restart cannot mend) is started again from the last commit; first
  the hosts are asked whether they answer (mpirun's remote agent), and those that do not are
  blacklisted: left out of the starts for good, or with --blacklist-cooldown-range for a while,
  as Horovod's elastic driver does with the hosts of failed workers (a host that answers is used
  again: the failure of a process on it may well have been the process's);
- every start after the first counts against --reset-limit;
- the ranks run with HOROVOD_ELASTIC=1, as horovodrun's elastic ranks do: Horovod's
  DistributedOptimizer reduces even in a job of one rank then, as the world may grow.
hvdtrain.ray's elastic RayExecutor and hvdtrain.spark.run_elastic drive their jobs with the same
loop: their hosts are Ray's nodes or Spark's task slots (ElasticOptions.discovery), and their
messages name their arguments (Terms).
"""

import collections
import math
import os
import random
import shlex
import socketserver
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from hvdtrain.core.elastic import HOSTS_VERSION_VARIABLE, STORE_VARIABLE
from hvdtrain.core.exits import EXIT_COMMUNICATION, EXIT_HOSTS_UPDATED, NOT_RESTARTED
from hvdtrain.run.hosts import Host, HostsError, parse_host

DISCOVERY_INTERVAL_S = 1.0  # Horovod's
DISCOVERY_TIMEOUT_S = 30.0
LONGEST_COOLDOWN_S = 3600  # Horovod's bound on --blacklist-cooldown-range
JOB_END_WAIT_S = 30.0  # for mpirun to end once a rank of a start that failed is gone
# What each start's ranks get from the driver's environment (run_elastic sets them there)
ELASTIC_VARIABLES = (STORE_VARIABLE, HOSTS_VERSION_VARIABLE, "HOROVOD_ELASTIC")


@dataclass(frozen=True)
class Terms:
    """How the driver's messages name it, its options and where its hosts come from: hvdtrun's
    flags, or the arguments of an API that drives its jobs with this loop (hvdtrain.ray)."""
    launcher: str = "hvdtrun"
    min_np: str = "--min-np"
    reset_limit: str = "--reset-limit"
    elastic_timeout: str = "--elastic-timeout"
    discovered: str = "the discovery script found"


@dataclass(frozen=True)
class ElasticOptions:
    discovery_script: Optional[str]  # None: the job's hosts come from discovery, else are fixed_hosts
    min_np: int
    max_np: Optional[int]
    slots_per_host: int
    reset_limit: Optional[int]
    elastic_timeout_s: float
    blacklist_cooldown_s: Optional[Tuple[int, int]] = None  # (MIN, MAX); None: blacklisted for good
    fixed_hosts: Tuple[Host, ...] = ()
    discovery: Optional[Callable[[], List[Host]]] = None  # finds the hosts, where no script does
    terms: Terms = Terms()


class Blacklist:
    """The hosts left out of the job's starts, each until its cooldown ends: for good without a
    cooldown range, else, as Horovod computes it, MIN * 2**n plus up to MIN at random for its n-th
    blacklisting, kept within [MIN, MAX] seconds."""

    def __init__(self, cooldown_range=None, clock=time.monotonic):
        self._range, self._clock = cooldown_range, clock
        self._until = {}  # host name -> when it may come back
        self._times = collections.Counter()

    def add(self, host):
        """Blacklist the host of that name; returns for how long, in words."""
        self._times[host] += 1
        if self._range is None:
            self._until[host] = math.inf
            return "for good"
        low, high = self._range
        cooldown = min(high, max(low, low * 2 ** self._times[host] + random.uniform(0, low)))
        self._until[host] = self._clock() + cooldown
        return f"for {cooldown:.0f} s"

    def without(self, hosts):
        """`hosts` but those blacklisted now."""
        now = self._clock()
        return [host for host in hosts if self._until.get(host.host, 0) <= now]


class DiscoveryError(Exception):
    """The discovery script failed or printed something that is not a host."""


def discover(options):
    """The hosts the discovery script prints now, in its order; else those `discovery` finds;
    else the fixed hosts."""
    if options.discovery is not None:
        return options.discovery()
    if options.discovery_script is None:
        return list(options.fixed_hosts)
    try:
        result = subprocess.run(shlex.split(options.discovery_script), capture_output=True, text=True,
                                timeout=DISCOVERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DiscoveryError(f"the host discovery script {options.discovery_script!r} cannot run: {error}") from None
    if result.returncode != 0:
        raise DiscoveryError(f"the host discovery script {options.discovery_script!r} exited with status "
                             f"{result.returncode}: {result.stderr.strip()}")
    try:
        found = [parse_host(line, f"the host discovery script {options.discovery_script!r} printed a line")
                 for line in result.stdout.split()]
    except HostsError as error:
        raise DiscoveryError(str(error)) from None
    return [Host(name, slots or options.slots_per_host) for name, slots in found]


def placed(hosts, num_proc):
    """The hosts' slots filled in order with `num_proc` ranks (hosts left without one dropped)."""
    taken, left = [], num_proc
    for host in hosts:
        if left <= 0:
            break
        taken.append(Host(host.host, min(host.slots, left)))
        left -= taken[-1].slots
    return taken


class CommitStore(socketserver.ThreadingTCPServer):
    """The ranks' last commit (rank 0 sends it) and the version of the hosts, over TCP: one
    request per connection (PUT n + n bytes, GET, VERSION, RETURNED, FAILED s), answered OK, DATA
    n + n bytes, NONE or VERSION v. Rank 0 GETs as `hvd.elastic.run` begins and says RETURNED when
    its function has returned: `runs` counts the runs a job began and has not ended so. A rank
    whose function raised an error that a restart would meet again says FAILED with its status:
    `failed`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("", 0), _StoreRequest)
        self.commit, self.hosts_version, self.runs, self.failed = None, 0, 0, None
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _StoreRequest(socketserver.StreamRequestHandler):
    def handle(self):
        store = self.server
        words = self.rfile.readline().decode().split()
        if words[:1] == ["PUT"]:
            store.commit = self.rfile.read(int(words[1]))
            self.wfile.write(b"OK 0\n")
        elif words[:1] == ["RETURNED"]:
            store.runs -= 1
            self.wfile.write(b"OK 0\n")
        elif words[:1] == ["FAILED"]:
            store.failed = int(words[1])
            self.wfile.write(b"OK 0\n")
        elif words[:1] == ["GET"]:
            store.runs += 1
            commit = store.commit
            self.wfile.write(b"NONE 0\n" if commit is None else b"DATA %d\n" % len(commit) + commit)
        elif words[:1] == ["VERSION"]:
            self.wfile.write(b"VERSION %d\n" % store.hosts_version)


def watch_hosts(options, store, launched, stop, blacklist):
    """While the job runs: raise the hosts' version once when discovery finds hosts other than
    those the job was started with, the blacklisted left out (the ranks then stop at their next
    commit; a host whose cooldown ended is found again so)."""
    while not stop.wait(DISCOVERY_INTERVAL_S):
        try:
            found = blacklist.without(discover(options))
        except DiscoveryError as error:
            print(f"{options.terms.launcher}: {error}; the job goes on on its hosts", file=sys.stderr, flush=True)
            continue
        if found != launched:
            store.hosts_version += 1
            print(f"{options.terms.launcher}: the hosts changed to {format_hosts(found)}; the job starts again "
                  f"on them at its next commit", file=sys.stderr, flush=True)
            return


def hosts_for_a_start(options, deadline, blacklist):
    """The discovered hosts but the blacklisted, once they have the job's least slots (--min-np),
    waiting until `deadline`."""
    while True:
        found = discover(options)
        hosts = blacklist.without(found)
        if sum(host.slots for host in hosts) >= options.min_np:
            return hosts
        if time.monotonic() >= deadline:
            left_out = [host for host in found if host not in hosts]
            blacklisted = f", and blacklisted {format_hosts(left_out)}" if left_out else ""
            terms = options.terms
            found_by = terms.discovered if options.discovery_script or options.discovery else "the hosts given offer"
            raise DiscoveryError(f"{found_by} {sum(h.slots for h in hosts)} slots "
                                 f"({format_hosts(hosts) or 'no hosts'}){blacklisted}, fewer than {terms.min_np} "
                                 f"{options.min_np}, for the whole {terms.elastic_timeout}")
        time.sleep(DISCOVERY_INTERVAL_S)


def horovods_process_counts(min_num_proc, max_num_proc, min_np, max_np, stacklevel=3):
    """(min_num_proc, max_num_proc), which Horovod's APIs also take by their deprecated names
    min_np and max_np, with Horovod's warnings; `stacklevel` points them at the user's call."""
    if min_np is not None:
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=stacklevel)
        min_num_proc = min_np
    if max_np is not None:
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=stacklevel)
        max_num_proc = max_np
    return min_num_proc, max_num_proc


def failed_start_status(process):
    """The status of a start whose call failed, as run_elastic reads it: mpirun's, once it ends;
    a status of 0 (Open MPI 5's mpirun ends so when it loses a host), or an mpirun still running
    after JOB_END_WAIT_S (which its caller stops), counts as a lost peer."""
    try:
        status = process.wait(timeout=JOB_END_WAIT_S)
    except subprocess.TimeoutExpired:
        return EXIT_COMMUNICATION
    return 128 - status if status < 0 else status or EXIT_COMMUNICATION


def job_ended_error(terms, status):
    """What an API that drives its jobs with run_elastic (hvdtrain.ray, hvdtrain.spark) raises
    where the loop ended with the nonzero `status`."""
    return RuntimeError(f"{terms.launcher}: the elastic job ended with exit status {status}: "
                        f"{NOT_RESTARTED.get(status, 'see the messages above')}")


def format_hosts(hosts):
    return ",".join(f"{host.host}:{host.slots}" for host in hosts)


def run_elastic(elastic, start_job, addresses, answering):
    """Start and restart the job as the module says; returns the exit status the launcher ends
    with. `start_job(num_proc, hosts)` runs one job of `num_proc` ranks (hvdtrun's launch: the
    start timeout, Ctrl-C) and returns its status; the ranks reach the commit store at this
    machine's `addresses`; `answering(hosts)` are those of `hosts` that answer."""
    terms = elastic.terms

    def say(text):
        print(f"{terms.launcher}: {text}", file=sys.stderr, flush=True)

    store = CommitStore()
    store_address = ",".join(["127.0.0.1", *addresses]) + f":{store.server_address[1]}"
    blacklist = Blacklist(elastic.blacklist_cooldown_s)
    resets = 0
    # Put back afterwards: a process that goes on (a notebook's, hvdtrain.ray's driver) would
    # hand them to its next, unrelated jobs.
    before = {name: os.environ.get(name) for name in ELASTIC_VARIABLES}
    try:
        while True:
            try:
                hosts = hosts_for_a_start(elastic, time.monotonic() + elastic.elastic_timeout_s, blacklist)
            except DiscoveryError as error:
                say(str(error))
                return 1
            slots = sum(host.slots for host in hosts)
            num_proc = min(slots, elastic.max_np or slots)
            job_hosts = placed(hosts, num_proc)
            os.environ[STORE_VARIABLE] = store_address  # the ranks' environment is the launcher's
            os.environ[HOSTS_VERSION_VARIABLE] = str(store.hosts_version)
            os.environ["HOROVOD_ELASTIC"] = "1"
            stop = threading.Event()
            threading.Thread(target=watch_hosts, args=(elastic, store, hosts, stop, blacklist), daemon=True).start()
            store.runs, store.failed = 0, None
            try:
                status = start_job(num_proc, job_hosts)
            finally:
                stop.set()
            if status != 0 and store.failed is not None:
                status = store.failed  # a rank's own error, whichever status mpirun counted first
            if status == 0 and store.runs > 0:
                say("mpirun ended with status 0, but hvd.elastic.run had not returned on rank 0 (mpirun ends so "
                    "when it loses a host)")
                status = EXIT_COMMUNICATION
            if status == 0:
                return 0
            if status in NOT_RESTARTED or status == 130:
                if status in NOT_RESTARTED:
                    say(f"the job failed (exit status {status}): {NOT_RESTARTED[status]}, so it is not started again")
                return status
            resets += 1
            why = "the hosts changed" if status == EXIT_HOSTS_UPDATED else f"the job failed (exit status {status})"
            if elastic.reset_limit is not None and resets > elastic.reset_limit:
                say(f"{why}; it has been started again {resets - 1} times ({terms.reset_limit} "
                    f"{elastic.reset_limit}), so it stops here")
                return status or 1
            if status != EXIT_HOSTS_UPDATED:
                reached = {host.host for host in answering(hosts)}
                for host in hosts:
                    if host.host not in reached:
                        say(f"host {host.host} does not answer; it is blacklisted {blacklist.add(host.host)}")
            say(f"{why}; starting it again from its last commit (reset {resets})")
    finally:
        store.shutdown()
        store.server_close()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

