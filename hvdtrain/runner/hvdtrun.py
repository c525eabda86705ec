"""The `hvdtrun` command: Horovod 0.28's `horovodrun` for hvdtrain, so that a Horovod script
(its import line changed to hvdtrain) starts as it did:

    hvdtrun -np 4 -H node1:2,node2:2 python train.py --epochs 10

It takes horovodrun's flags with their names, short forms, defaults and meanings, and starts
the job with mpirun through the launcher the `hvdtrain` command uses (launcher.py): each rank
gets its share of its host's cores for its threads, Open MPI yields instead of spinning, mpirun
runs in a session of its own and Ctrl-C stops the whole job.

- `-np/--num-proc N` ranks on `-H/--hosts NAME:SLOTS,...` or `-hostfile/--hostfile FILE` (lines
  `NAME slots=N`), else on this machine; more ranks than the hosts' slots are refused.
- The tuning flags become the HOROVOD_* variables the ranks' engine reads
  (hvdtrain/core/settings.py), as horovodrun sets them: --fusion-threshold-mb (MiB, into
  bytes), --cycle-time-ms, --cache-capacity, --timeline-filename, --timeline-mark-cycles,
  --no-stall-check, --stall-check-warning-time-seconds, --stall-check-shutdown-time-seconds,
  --log-level.
- `--mpi-args "..."` is split as a shell would and given to mpirun.
- `--network-interface(s) NAME[,NAME]` becomes Open MPI's btl_tcp_if_include (the ranks'
  traffic) and oob_tcp_if_include (its daemons' traffic), and NCCL_SOCKET_IFNAME, as horovodrun
  sets it for NCCL.
- `--start-timeout S` (else HOROVOD_START_TIMEOUT, else 30 s, horovodrun's default) bounds the
  time from launch until every rank has started. Neither mpirun nor the engine can bound it
  (tried with Open MPI 5.0.11: --spawn-timeout does not cover the start of mpirun's daemons on
  the hosts, and MPI's initialization, where the ranks first meet, waits for every rank without
  a limit, pmix_base_exchange_timeout notwithstanding), so hvdtrun keeps it itself: each rank
  first runs rank_start.py, which reports to a socket of hvdtrun's and then executes the
  command in its place. A job whose ranks have not all reported in time is stopped, naming the
  missing ranks (exit status 1).
- `--check-build` shows what this install has, in horovodrun's layout.

Every other horovodrun flag is refused by name with the reason, as are unknown ones: one line
on stderr and exit status 2. Otherwise hvdtrun exits with the job's status (130 after Ctrl-C).
"""

import difflib
import fcntl
import importlib.util
import os
import shlex
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional

from hvdtrain import __version__
from hvdtrain.runner import elastic_driver, launcher

DEFAULT_START_TIMEOUT_S = 30  # horovodrun's
START_TIMEOUT_VARIABLE = "HOROVOD_START_TIMEOUT"
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")  # horovodrun's --log-level choices
LOCAL_HOST_NAMES = ("localhost", "127.0.0.1")
SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address

AUTOTUNE = "hvdtrain does not autotune; set --fusion-threshold-mb and --cycle-time-ms yourself"
GLOO = "hvdtrain has no Gloo controller; it runs on MPI"
LOG_TIME = "HOROVOD_LOG_HIDE_TIME is not implemented by hvdtrain"
SSH = "give mpirun's ssh options with --mpi-args (--mca plm_ssh_args '...')"
# horovodrun 0.28's flags that hvdtrun does not take, each with why: refused by name rather than
# ignored, since a job that silently runs without what it asked for misleads more than one that
# does not start. (tests/runner/test_hvdtrun.py lists them from Horovod's launch.py.)
REFUSED = {
    "--disable-cache": "hvdtrun makes no start-up checks to cache",
    "--output-filename": "the ranks' output comes on hvdtrun's stdout and stderr; redirect those",
    "--config-file": "hvdtrun reads no config file; give the flags on the command line",
    "-p": SSH, "--ssh-port": SSH, "-i": SSH, "--ssh-identity-file": SSH,
    "--hierarchical-allreduce": "hvdtrain's engine has no hierarchical allreduce",
    "--no-hierarchical-allreduce": "hvdtrain's engine has no hierarchical allreduce",
    "--hierarchical-allgather": "hvdtrain's engine has no hierarchical allgather",
    "--no-hierarchical-allgather": "hvdtrain's engine has no hierarchical allgather",
    "--torus-allreduce": "hvdtrain's engine has no torus allreduce",
    "--no-torus-allreduce": "hvdtrain's engine has no torus allreduce",
    "--autotune": AUTOTUNE, "--no-autotune": AUTOTUNE, "--autotune-log-file": AUTOTUNE,
    "--autotune-warmup-samples": AUTOTUNE, "--autotune-steps-per-sample": AUTOTUNE,
    "--autotune-bayes-opt-max-samples": AUTOTUNE, "--autotune-gaussian-process-noise": AUTOTUNE,
    "--blacklist-cooldown-range": "hvdtrun does not blacklist hosts: a host the discovery script lists is used",
    "--mpi-threads-disable": "hvdtrain's engine always runs MPI with thread support",
    "--no-mpi-threads-disable": "hvdtrain's engine always runs MPI with thread support",
    "--tcp": "choose Open MPI's transports with --mpi-args (e.g. --mca btl self,tcp)",
    "--binding-args": "hvdtrun starts the ranks unbound (--bind-to none), as horovodrun does with Open MPI",
    "--num-nccl-streams": "HOROVOD_NUM_NCCL_STREAMS is not implemented by hvdtrain",
    "--thread-affinity": "HOROVOD_THREAD_AFFINITY is not implemented by hvdtrain",
    "--gloo-timeout-seconds": GLOO, "--gloo": GLOO,
    "--mpi": "hvdtrun always runs on MPI; drop the flag",
    "--jsrun": "hvdtrun launches with mpirun only",
    "--log-with-timestamp": LOG_TIME, "--log-without-timestamp": LOG_TIME, "--log-hide-timestamp": LOG_TIME,
    "--no-log-hide-timestamp": LOG_TIME,
    "-prefix-timestamp": "give Open MPI's --timestamp-output with --mpi-args",
    "--prefix-output-with-timestamp": "give Open MPI's --timestamp-output with --mpi-args",
}


class UsageError(Exception):
    """A command line hvdtrun refuses: one line, exit status 2."""


@dataclass
class Options:
    """hvdtrun's command line in horovodrun's terms; None where a flag was not given (then the
    engine's default applies)."""
    num_proc: Optional[int] = None
    hosts: Optional[str] = None
    hostfile: Optional[str] = None
    start_timeout: Optional[int] = None
    verbose: bool = False
    check_build: bool = False
    show_help: bool = False
    show_version: bool = False
    timeline_filename: Optional[str] = None
    timeline_mark_cycles: Optional[bool] = None
    fusion_threshold_mb: Optional[int] = None
    cycle_time_ms: Optional[float] = None
    cache_capacity: Optional[int] = None
    no_stall_check: Optional[bool] = None
    stall_check_warning_time_seconds: Optional[int] = None
    stall_check_shutdown_time_seconds: Optional[int] = None
    log_level: Optional[str] = None
    mpi_args: Optional[str] = None
    network_interfaces: List[str] = field(default_factory=list)
    # elastic mode (elastic_driver.py)
    host_discovery_script: Optional[str] = None
    min_np: Optional[int] = None
    max_np: Optional[int] = None
    slots_per_host: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: Optional[int] = None
    command: List[str] = field(default_factory=list)


def positive_int(text):
    """a whole number of 1 or more"""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def non_negative_int(text):
    """a whole number of 0 or more"""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def non_negative_float(text):
    """a number of 0 or more"""
    value = float(text)
    if not value >= 0:  # refuses nan too
        raise ValueError(text)
    return value


def log_level(text):
    """one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL"""
    if text.upper() not in LOG_LEVELS:
        raise ValueError(text)
    return text.upper()


# Flags with a value: the Options field each sets and what reads the value (its docstring
# says what it takes, for the error when it cannot).
VALUE_FLAGS = {
    "-np": ("num_proc", positive_int), "--num-proc": ("num_proc", positive_int),
    "-H": ("hosts", str), "--hosts": ("hosts", str),
    "-hostfile": ("hostfile", str), "--hostfile": ("hostfile", str),
    "--start-timeout": ("start_timeout", positive_int),
    "--timeline-filename": ("timeline_filename", str),
    "--fusion-threshold-mb": ("fusion_threshold_mb", non_negative_int),
    "--cycle-time-ms": ("cycle_time_ms", non_negative_float),
    "--cache-capacity": ("cache_capacity", non_negative_int),
    "--stall-check-warning-time-seconds": ("stall_check_warning_time_seconds", non_negative_int),
    "--stall-check-shutdown-time-seconds": ("stall_check_shutdown_time_seconds", non_negative_int),
    "--log-level": ("log_level", log_level),
    "--mpi-args": ("mpi_args", str),
    "--network-interface": ("network_interfaces", str),
    "--network-interfaces": ("network_interfaces", str),
    "--host-discovery-script": ("host_discovery_script", str),
    "--min-np": ("min_np", positive_int), "--min-num-proc": ("min_np", positive_int),
    "--max-np": ("max_np", positive_int), "--max-num-proc": ("max_np", positive_int),
    "--slots-per-host": ("slots_per_host", positive_int),
    "--reset-limit": ("reset_limit", non_negative_int),
    "--elastic-timeout": ("elastic_timeout", positive_int),
}
ELASTIC_FLAGS = {"min_np": "--min-np", "max_np": "--max-np", "slots_per_host": "--slots-per-host",
                 "reset_limit": "--reset-limit", "elastic_timeout": "--elastic-timeout"}
DEFAULT_ELASTIC_TIMEOUT_S = 600  # horovodrun's
# Flags without a value: the Options field and the value they set. The negations are
# horovodrun's too (hidden from its help): they state its defaults explicitly.
SWITCHES = {
    "-h": ("show_help", True), "--help": ("show_help", True),
    "-v": ("show_version", True), "--version": ("show_version", True),
    "--verbose": ("verbose", True),
    "-cb": ("check_build", True), "--check-build": ("check_build", True),
    "--timeline-mark-cycles": ("timeline_mark_cycles", True),
    "--no-timeline-mark-cycles": ("timeline_mark_cycles", False),
    "--no-stall-check": ("no_stall_check", True),
    "--stall-check": ("no_stall_check", False),
}
HELP = """\
usage: hvdtrun -np N [-H NAME:SLOTS,... | --hostfile FILE] [flags] COMMAND...

Runs COMMAND on N ranks with mpirun, as Horovod's horovodrun does. Flags (horovodrun's):
  -np, --num-proc N                     ranks to start
  -H, --hosts NAME:SLOTS,...            hosts and their slots (default: localhost:N)
  -hostfile, --hostfile FILE            hosts from lines `NAME slots=N`
  --start-timeout S                     seconds until every rank has started (HOROVOD_START_TIMEOUT, 30)
  --network-interface(s) NAME[,NAME]    interfaces for MPI's and NCCL's traffic
  --mpi-args "ARGS"                     more mpirun arguments
  --fusion-threshold-mb MB, --cycle-time-ms MS, --cache-capacity N, --timeline-filename FILE,
  --timeline-mark-cycles, --no-stall-check, --stall-check-warning-time-seconds S,
  --stall-check-shutdown-time-seconds S, --log-level LEVEL
                                        the engine's settings (HOROVOD_* variables)
  --verbose                             show the mpirun command and when all ranks have started
  -cb, --check-build                    show what this install supports
  -v, --version                         show hvdtrain's version
Elastic jobs (Horovod Elastic scripts; the job is started again on the hosts there are):
  --host-discovery-script S             prints the hosts, HOST or HOST:SLOTS per line
  --min-np N, --max-np M                the fewest ranks to run on (default -np), the most
  --slots-per-host N                    slots of a host printed without them (default 1)
  --reset-limit N, --elastic-timeout S  the most restarts; the longest wait for --min-np slots
Other horovodrun flags are refused."""


def parse_command_line(argv):
    """Options from hvdtrun's arguments: flags up to the first word that is not one (or `--`),
    the command from there on. UsageError names what cannot be taken."""
    options = Options()
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        token = argv[index]
        index += 1
        if token == "--":
            break
        flag, has_value, value = token.partition("=")
        if flag in REFUSED:
            raise UsageError(f"{flag} is not supported by hvdtrun ({REFUSED[flag]})")
        if flag in SWITCHES:
            if has_value:
                raise UsageError(f"{flag} takes no value")
            setattr(options, *SWITCHES[flag])
        elif flag in VALUE_FLAGS:
            if not has_value:
                if index == len(argv):
                    raise UsageError(f"{flag} needs a value")
                value = argv[index]
                index += 1
            name, read = VALUE_FLAGS[flag]
            try:
                parsed = read(value)
            except ValueError:
                raise UsageError(f"{flag} {value!r}: must be {read.__doc__}") from None
            if name == "network_interfaces":  # given several times, or as a list: all of them
                options.network_interfaces += [nic for nic in parsed.split(",")
                                               if nic and nic not in options.network_interfaces]
            else:
                setattr(options, name, parsed)
        else:
            nearest = difflib.get_close_matches(flag, [*SWITCHES, *VALUE_FLAGS], n=1)
            hint = f"; did you mean {nearest[0]}?" if nearest else "; hvdtrun --help lists the flags"
            raise UsageError(f"unknown flag {flag}{hint}")
    options.command = argv[index:]
    if options.show_help or options.show_version or options.check_build:
        return options
    if options.host_discovery_script is None:
        given = [flag for name, flag in ELASTIC_FLAGS.items() if getattr(options, name) is not None]
        if given:
            raise UsageError(f"{given[0]} is for elastic jobs: it needs --host-discovery-script")
    elif options.hosts or options.hostfile:
        raise UsageError("-H/--hosts and --hostfile name fixed hosts; an elastic job's come from "
                         "--host-discovery-script")
    elif options.min_np and options.max_np and options.min_np > options.max_np:
        raise UsageError(f"--min-np {options.min_np} is more than --max-np {options.max_np}")
    if options.num_proc is None and options.host_discovery_script is None:
        raise UsageError("-np/--num-proc is required: the number of ranks to start")
    if not options.command:
        raise UsageError("no command to run (e.g. hvdtrun -np 2 python train.py)")
    if options.hosts and options.hostfile:
        raise UsageError("-H/--hosts and --hostfile both name hosts; give one of them")
    if options.timeline_mark_cycles and not options.timeline_filename:
        raise UsageError("--timeline-mark-cycles marks cycles on the timeline: it needs --timeline-filename")
    return options


def hosts_from_list(text):
    """Hosts of horovodrun's -H: `NAME:SLOTS,NAME:SLOTS,...`."""
    hosts = []
    for entry in text.split(","):
        name, _, slots = entry.strip().partition(":")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise UsageError(f"-H {text}: {entry.strip()!r} is not a host; each is NAME:SLOTS (e.g. node1:4,node2:4)")
        hosts.append(launcher.Host(name, int(slots)))
    return hosts


def hosts_from_file(path):
    """Hosts of horovodrun's host file: lines `NAME slots=N`; blank lines and # comments skipped."""
    try:
        with open(path) as hostfile:
            lines = hostfile.read().splitlines()
    except OSError as error:
        raise UsageError(f"--hostfile {path}: {error.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        slots = fields[1].removeprefix("slots=") if len(fields) == 2 and fields[1].startswith("slots=") else ""
        if not slots.isdigit() or int(slots) < 1:
            raise UsageError(f"--hostfile {path} line {number}: {line!r} is not a host; each line is 'NAME slots=N'")
        hosts.append(launcher.Host(fields[0], int(slots)))
    if not hosts:
        raise UsageError(f"--hostfile {path}: names no host")
    return hosts


def job_hosts(options):
    """The hosts the job runs on, refused where their slots cannot take -np ranks."""
    if options.hosts:
        hosts = hosts_from_list(options.hosts)
        given = f"-H {options.hosts}"
    elif options.hostfile:
        hosts = hosts_from_file(options.hostfile)
        given = f"--hostfile {options.hostfile} ({','.join(f'{h.host}:{h.slots}' for h in hosts)})"
    else:
        return [launcher.Host("localhost", options.num_proc)]
    slots = sum(host.slots for host in hosts)
    if options.num_proc > slots:
        raise UsageError(f"-np {options.num_proc} asks for {options.num_proc} ranks but {given} "
                         f"offers only {slots} slots")
    return hosts


def busiest_host_ranks(hosts, num_proc):
    """How many ranks the fullest host gets when mpirun fills the hosts slot by slot."""
    counts, left = [], num_proc
    for host in hosts:
        counts.append(min(host.slots, left))
        left -= counts[-1]
    return max(counts)


def start_timeout_s(options, env):
    if options.start_timeout is not None:
        return options.start_timeout
    raw = env.get(START_TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_START_TIMEOUT_S
    try:
        return positive_int(raw)
    except ValueError:
        raise UsageError(f"{START_TIMEOUT_VARIABLE}={raw!r}: must be {positive_int.__doc__} (seconds)") from None


def engine_variables(options):
    """The HOROVOD_* variables the tuning flags set, with horovodrun's names and units."""
    given = {
        "HOROVOD_FUSION_THRESHOLD": None if options.fusion_threshold_mb is None
        else options.fusion_threshold_mb * 1024 * 1024,
        "HOROVOD_CYCLE_TIME": options.cycle_time_ms,
        "HOROVOD_CACHE_CAPACITY": options.cache_capacity,
        "HOROVOD_TIMELINE": options.timeline_filename,
        "HOROVOD_TIMELINE_MARK_CYCLES": options.timeline_mark_cycles,
        "HOROVOD_STALL_CHECK_DISABLE": options.no_stall_check,
        "HOROVOD_STALL_CHECK_TIME_SECONDS": options.stall_check_warning_time_seconds,
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": options.stall_check_shutdown_time_seconds,
        "HOROVOD_LOG_LEVEL": options.log_level,
    }
    return {name: str(int(value)) if isinstance(value, bool) else str(value)
            for name, value in given.items() if value is not None}


def rank_environment(options, hosts):
    env = launcher.worker_environment(busiest_host_ranks(hosts, options.num_proc))
    # The start timeout is hvdtrun's to keep; on the ranks the engine would report it as a
    # Horovod variable it ignores.
    env.pop(START_TIMEOUT_VARIABLE, None)
    env.update(engine_variables(options))
    if options.network_interfaces:
        env["NCCL_SOCKET_IFNAME"] = ",".join(options.network_interfaces)
    return env


def mpirun_extra_args(options):
    args = []
    if options.network_interfaces:
        interfaces = ",".join(options.network_interfaces)
        args += ["--mca", "btl_tcp_if_include", interfaces, "--mca", "oob_tcp_if_include", interfaces]
    try:
        return args + shlex.split(options.mpi_args or "")
    except ValueError as error:
        raise UsageError(f"--mpi-args {options.mpi_args!r}: {error}") from None


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


@dataclass
class StartWatch:
    """hvdtrun's side of the start timeout: the socket the ranks report to, the addresses they
    may reach it at, and what came of it."""
    listener: socket.socket
    addresses: List[str]
    world_size: int
    timeout_s: int
    verbose: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    job_ended: bool = False
    missing: Optional[List[int]] = None  # the ranks that had not started when time ran out


def open_start_watch(options, hosts, timeout_s):
    """A StartWatch listening on this machine's loopback when every rank runs here, else on all
    its interfaces."""
    if all(host.host in LOCAL_HOST_NAMES for host in hosts):
        listener, addresses = socket.create_server(("127.0.0.1", 0)), ["127.0.0.1"]
    else:
        # The interfaces named for MPI's traffic where this machine has them; under other names
        # here (a bridge to the other hosts' eth0, say), any of its interfaces.
        addresses = interface_addresses(options.network_interfaces) or interface_addresses([])
        if not addresses:
            raise UsageError("this machine has no IPv4 address but loopback, where ranks on other hosts "
                             "could report that they have started")
        listener = socket.create_server(("", 0))
    return StartWatch(listener, addresses, options.num_proc, timeout_s, options.verbose)


def watch_start(watch, main_thread_id):
    """Collects the ranks' reports; when time runs out first, stops the job as Ctrl-C does
    (launcher.run stops all of it on KeyboardInterrupt)."""
    started_at = time.monotonic()
    deadline = started_at + watch.timeout_s
    started = set()
    while len(started) < watch.world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        watch.listener.settimeout(remaining)
        try:
            connection, _ = watch.listener.accept()
        except socket.timeout:
            break
        except OSError:
            return  # the listener was closed: the job has ended
        with connection:
            connection.settimeout(remaining)
            try:
                started.add(int(connection.recv(64).decode()))
            except (OSError, ValueError):
                pass  # not a rank's report
    if len(started) == watch.world_size:
        if watch.verbose:
            print(f"hvdtrun: all {watch.world_size} ranks started in {time.monotonic() - started_at:.1f} s",
                  file=sys.stderr, flush=True)
        return
    with watch.lock:
        if not watch.job_ended:
            watch.missing = sorted(set(range(watch.world_size)) - started)
            signal.pthread_kill(main_thread_id, signal.SIGINT)


def describe_ranks(ranks, shown=8):
    listed = ", ".join(map(str, ranks[:shown]))
    return listed + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")


def launch(options, hosts, extra_args, watch):
    """Runs the job; returns hvdtrun's exit status."""
    env = rank_environment(options, hosts)
    program = [sys.executable, "-m", "hvdtrain.runner.rank_start", ",".join(watch.addresses),
               str(watch.listener.getsockname()[1]), "--", *options.command]
    command = launcher.mpirun_command(program, hosts, num_proc=options.num_proc, env=env, extra_args=extra_args)
    if options.verbose:
        print(f"hvdtrun: starting {options.num_proc} ranks: {shlex.join(command)}", file=sys.stderr, flush=True)
    # A scheduler's SIGTERM stops the ranks too, and so does SIGINT (the start timeout's too) where
    # the shell started us in the background, which leaves SIGINT ignored
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, signal.default_int_handler)
    threading.Thread(target=watch_start, args=(watch, threading.get_ident()), daemon=True).start()
    try:
        result = launcher.run(command, env=env)
        with watch.lock:
            watch.job_ended = True
    except KeyboardInterrupt:
        if watch.missing:
            print(f"hvdtrun: {len(watch.missing)} of {options.num_proc} ranks had not started after "
                  f"{watch.timeout_s} s (rank {describe_ranks(watch.missing)}); the job was stopped. Check that "
                  f"the hosts can be reached, or give more time with --start-timeout", file=sys.stderr)
            return 1
        print("hvdtrun: interrupted; the job was stopped", file=sys.stderr)
        return 130
    # mpirun killed by a signal: the status a shell would report
    return result.returncode if result.returncode >= 0 else 128 - result.returncode


def check_build_report():
    """What this install supports, in horovodrun --check-build's layout."""
    from hvdtrain.core import horovod_api  # the engine's own answers; imports neither framework

    def mark(available):
        return "X" if available else " "

    def framework(module):
        return importlib.util.find_spec(module) is not None

    # hvdtrain has adapters for TensorFlow and PyTorch only: MXNet is never available.
    return "\n".join([
        f"hvdtrain v{__version__}:",
        "",
        "Available Frameworks:",
        f"    [{mark(framework('tensorflow'))}] TensorFlow",
        f"    [{mark(framework('torch'))}] PyTorch",
        "    [ ] MXNet",
        "",
        "Available Controllers:",
        f"    [{mark(horovod_api.mpi_built())}] MPI",
        f"    [{mark(horovod_api.gloo_built())}] Gloo",
        "",
        "Available Tensor Operations:",
        f"    [{mark(horovod_api.nccl_built())}] NCCL",
        f"    [{mark(horovod_api.ddl_built())}] DDL",
        f"    [{mark(horovod_api.ccl_built())}] CCL",
        f"    [{mark(horovod_api.mpi_built())}] MPI",
        f"    [{mark(horovod_api.gloo_built())}] Gloo",
    ])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        options = parse_command_line(argv)
        if options.show_help:
            print(HELP)
            sys.exit(0)
        if options.show_version:
            print(f"hvdtrun (hvdtrain {__version__})")
            sys.exit(0)
        if options.check_build:
            print(check_build_report())
            sys.exit(0)
        extra_args = mpirun_extra_args(options)
        timeout_s = start_timeout_s(options, os.environ)
        if options.host_discovery_script is not None:
            sys.exit(run_elastically(options, extra_args, timeout_s))
        hosts = job_hosts(options)
        watch = open_start_watch(options, hosts, timeout_s)
    except UsageError as error:
        print(f"hvdtrun: {error}", file=sys.stderr)
        sys.exit(2)
    with watch.listener:
        sys.exit(launch(options, hosts, extra_args, watch))


def run_elastically(options, extra_args, timeout_s):
    """The elastic mode (elastic_driver.py): each start of the job is one `launch`."""
    elastic = elastic_driver.ElasticOptions(
        discovery_script=options.host_discovery_script,
        min_np=options.min_np or options.num_proc or 1,
        max_np=options.max_np,
        slots_per_host=options.slots_per_host or 1,
        reset_limit=options.reset_limit,
        elastic_timeout_s=options.elastic_timeout or DEFAULT_ELASTIC_TIMEOUT_S)

    def start_job(job_options, hosts):
        watch = open_start_watch(job_options, hosts, timeout_s)
        with watch.listener:
            return launch(job_options, hosts, extra_args, watch)

    addresses = interface_addresses(options.network_interfaces) or interface_addresses([])
    return elastic_driver.run_elastic(options, elastic, start_job, addresses)


if __name__ == "__main__":
    main()
