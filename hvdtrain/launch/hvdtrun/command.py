"""The `hvdtrun` command: Horovod 0.28's `horovodrun` for hvdtrain, so that a Horovod script
(its import line changed to hvdtrain) starts as it did:

    hvdtrun -np 4 -H node1:2,node2:2 python train.py --epochs 10

It reads horovodrun's command line with horovodrun's flags, argument groups, short forms and
defaults (argparse, as horovodrun does), and starts the job with mpirun through the launcher the
`hvdtrain` command uses (hvdtrain/launch/mpirun.py): each rank gets its share of its host's cores
for its threads, Open MPI yields instead of spinning, mpirun runs in a session of its own and
Ctrl-C stops the whole job.

- `-np/--num-proc N` ranks on `-H/--hosts` or `-hostfile/--hostfile` hosts (the grammar of
  hvdtrain/run/hosts.py: `NAME:SLOTS`; a hostfile's lines `NAME slots=SLOTS`, `NAME:SLOTS` or
  `NAME`; a name without slots has one), else on this machine; more ranks than the hosts' slots
  are refused.
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
  command in its place (rank_watch.py). A job whose ranks have not all reported in time is
  stopped, naming the missing ranks (exit status 1).
- A job that mpirun ends with status 0 while some rank's process has not ended (Open MPI 5's
  mpirun does so when it loses a host) fails with status 75, naming the ranks and where they ran.
- `--host-discovery-script S` and the elastic flags, or `--min-np N` on fixed hosts, run a
  Horovod Elastic script (elastic.py).
- `--check-build` shows what this install has, in horovodrun's layout.

Every other horovodrun flag is refused by name with the reason, as are unknown ones: one line
on stderr and exit status 2. Otherwise hvdtrun exits with the job's status (130 after Ctrl-C).
"""

import argparse
import copy
import difflib
import importlib.util
import os
import shlex
import shutil
import signal
import sys

from hvdtrain import __version__
from hvdtrain.core.exits import EXIT_COMMUNICATION, EXIT_CONFIG
from hvdtrain.launch import mpirun
from hvdtrain.launch.hvdtrun import config_file, elastic, output_files, rank_watch
from hvdtrain.run.hosts import Host, HostsError, all_on_this_machine, parse_hosts, read_hostfile

DEFAULT_START_TIMEOUT_S = 30  # horovodrun's
DEFAULT_ELASTIC_TIMEOUT_S = 600  # horovodrun's
START_TIMEOUT_VARIABLE = "HOROVOD_START_TIMEOUT"
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")  # horovodrun's --log-level choices

AUTOTUNE = "hvdtrain does not autotune; set --fusion-threshold-mb and --cycle-time-ms yourself"
GLOO = "hvdtrain has no Gloo controller; it runs on MPI"
HIERARCHICAL = "hvdtrain's engine has no hierarchical {}"
MPI_THREADS = "hvdtrain's engine always runs MPI with thread support"
# horovodrun 0.28's flags that hvdtrun does not take, by horovodrun's argument group, each with
# why: refused by name rather than ignored, since a job that silently runs without what it asked
# for misleads more than one that does not start. (Their list is checked against Horovod's
# launch.py by the tests.)
REFUSED = {
    "tuneable parameter arguments": {
        ("--hierarchical-allreduce",): HIERARCHICAL.format("allreduce"),
        ("--hierarchical-allgather",): HIERARCHICAL.format("allgather"),
        ("--torus-allreduce",): "hvdtrain's engine has no torus allreduce"},
    "autotune arguments": {(flag,): AUTOTUNE for flag in (
        "--autotune", "--autotune-log-file", "--autotune-warmup-samples",
        "--autotune-steps-per-sample", "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise")},
    "library arguments": {
        ("--mpi-threads-disable",): MPI_THREADS,
        ("--num-nccl-streams",): "HOROVOD_NUM_NCCL_STREAMS is not implemented by hvdtrain",
        ("--gloo-timeout-seconds",): GLOO},
    "controller arguments": {("--gloo",): GLOO, ("--jsrun",): "hvdtrun launches with mpirun only"},
}
# horovodrun 0.28's flags that ask for what hvdtrun does anyway: taken, so that a job script
# written for horovodrun runs unchanged. By argument group, each with what hvdtrun does.
ALREADY_SO = {
    None: {"--disable-cache": "hvdtrun caches no start-up checks"},
    "tuneable parameter arguments": {"--no-hierarchical-allreduce": "hvdtrain's allreduce is not hierarchical",
                                     "--no-hierarchical-allgather": "hvdtrain's allgather is not hierarchical",
                                     "--no-torus-allreduce": "hvdtrain's allreduce is not a torus"},
    "autotune arguments": {"--no-autotune": "hvdtrain does not autotune"},
    "library arguments": {"--no-mpi-threads-disable": "hvdtrain's engine runs MPI with thread support"},
    "controller arguments": {"--mpi": "hvdtrun runs on MPI"},
}
# The elastic flags' destinations, by the name a refusal gives them.
ELASTIC_FLAGS = {"min_np": "--min-np", "max_np": "--max-np", "slots_per_host": "--slots-per-host",
                 "reset_limit": "--reset-limit", "elastic_timeout": "--elastic-timeout",
                 "blacklist_cooldown_range": "--blacklist-cooldown-range"}


class UsageError(Exception):
    """A command line hvdtrun refuses: one line, exit status 2."""


def positive_int(text):
    return _number(text, int, lambda value: value >= 1, "a whole number of 1 or more")


def non_negative_int(text):
    return _number(text, int, lambda value: value >= 0, "a whole number of 0 or more")


def non_negative_float(text):
    return _number(text, float, lambda value: value >= 0, "a number of 0 or more")  # refuses nan too


def _number(text, kind, allowed, described):
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not allowed(value):
        raise argparse.ArgumentTypeError(f"{text!r}: must be {described}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused command line is a UsageError, for one line and exit status 2."""

    def error(self, message):
        raise UsageError(message)


class _Refused(argparse.Action):
    """A horovodrun flag hvdtrun does not take: refused with the reason, whatever value follows."""

    def __init__(self, option_strings, dest, reason, **kwargs):
        super().__init__(option_strings, dest, nargs="*", help=argparse.SUPPRESS, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(f"{option_string} is not supported by hvdtrun ({self.reason})")


class _Interfaces(argparse.Action):
    """--network-interface(s): given several times, or as a list, all of them, each once."""

    def __call__(self, parser, namespace, values, option_string=None):
        chosen = getattr(namespace, self.dest)
        chosen += [nic for nic in values.split(",") if nic and nic not in chosen]


def build_parser():
    parser = _Parser(prog="hvdtrun", description="Runs COMMAND on -np ranks with mpirun, as Horovod's horovodrun "
                                                 "does.",
                     epilog="Other horovodrun flags are refused, each with the reason.")
    parser.add_argument("-v", "--version", action="version", version=f"hvdtrun (hvdtrain {__version__})")
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=positive_int, metavar="N", help="ranks to start")
    parser.add_argument("-cb", "--check-build", action="store_true", help="show what this install supports")
    parser.add_argument("--start-timeout", type=positive_int, metavar="S",
                        help=f"seconds until every rank has started ({START_TIMEOUT_VARIABLE}, else "
                             f"{DEFAULT_START_TIMEOUT_S})")
    parser.add_argument("--network-interfaces", "--network-interface", dest="network_interfaces", default=[],
                        action=_Interfaces, metavar="NAME[,NAME]", help="interfaces for MPI's and NCCL's traffic")
    parser.add_argument("--verbose", action="store_true",
                        help="show the mpirun command and when all ranks have started")
    parser.add_argument("--output-filename", metavar="DIR",
                        help="also write each rank's stdout and stderr to DIR/rank.N/stdout and stderr")
    parser.add_argument("--config-file", metavar="FILE",
                        help="horovodrun's YAML file of tuning flags; the command line's win over it")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command every rank runs")
    groups = {None: parser}

    def group(title):
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        return groups[title]

    tuning = group("tuneable parameter arguments")
    tuning.add_argument("--fusion-threshold-mb", type=non_negative_int, metavar="MB",
                        help="HOROVOD_FUSION_THRESHOLD, in MiB")
    tuning.add_argument("--cycle-time-ms", type=non_negative_float, metavar="MS", help="HOROVOD_CYCLE_TIME")
    tuning.add_argument("--cache-capacity", type=non_negative_int, metavar="N", help="HOROVOD_CACHE_CAPACITY")
    flexible = group("elastic arguments")
    flexible.add_argument("--min-np", "--min-num-proc", dest="min_np", type=positive_int, metavar="N",
                          help="the fewest ranks to run on (default -np)")
    flexible.add_argument("--max-np", "--max-num-proc", dest="max_np", type=positive_int, metavar="N",
                          help="the most ranks")
    flexible.add_argument("--slots-per-host", type=positive_int, metavar="N",
                          help="slots of a host the discovery script prints without them (default 1)")
    flexible.add_argument("--elastic-timeout", type=positive_int, metavar="S",
                          help=f"the longest wait for --min-np slots (default {DEFAULT_ELASTIC_TIMEOUT_S} s)")
    flexible.add_argument("--reset-limit", type=non_negative_int, metavar="N", help="the most restarts")
    flexible.add_argument("--blacklist-cooldown-range", type=positive_int, nargs=2, metavar=("MIN", "MAX"),
                          help="a blacklisted host may come back after MIN to MAX seconds (default: never)")
    timeline = group("timeline arguments")
    timeline.add_argument("--timeline-filename", metavar="FILE", help="HOROVOD_TIMELINE")
    timeline.add_argument("--timeline-mark-cycles", action="store_const", const=True,
                          help="HOROVOD_TIMELINE_MARK_CYCLES")
    # The negations are horovodrun's too (hidden from its help): they state its defaults explicitly.
    timeline.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles", action="store_const", const=False,
                          help=argparse.SUPPRESS)
    stall = group("stall check arguments")
    stall.add_argument("--no-stall-check", action="store_const", const=True, help="HOROVOD_STALL_CHECK_DISABLE")
    stall.add_argument("--stall-check", dest="no_stall_check", action="store_const", const=False,
                       help=argparse.SUPPRESS)
    stall.add_argument("--stall-check-warning-time-seconds", type=non_negative_int, metavar="S",
                       help="HOROVOD_STALL_CHECK_TIME_SECONDS")
    stall.add_argument("--stall-check-shutdown-time-seconds", type=non_negative_int, metavar="S",
                       help="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    library = group("library arguments")
    library.add_argument("--mpi-args", metavar="ARGS", help="more mpirun arguments, split as a shell would")
    library.add_argument("--binding-args", metavar="ARGS",
                         help="mpirun's binding and mapping in place of --bind-to none --map-by slot")
    library.add_argument("--thread-affinity", metavar="CORE[,CORE]",
                         help="HOROVOD_THREAD_AFFINITY: the core of each local rank's engine thread")
    library.add_argument("--tcp", action="store_true",
                         help="MPI's traffic over TCP between hosts (Open MPI's ob1 with self, sm and tcp)")
    ssh = group("SSH arguments")
    ssh.add_argument("-p", "--ssh-port", type=positive_int, metavar="PORT", help="ssh's port on every host")
    ssh.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="ssh's private key")
    logs = group("logging arguments")
    logs.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                      help=f"HOROVOD_LOG_LEVEL: {', '.join(LOG_LEVELS)}")
    # horovodrun's older names too: --no-log-hide-timestamp, --log-hide-timestamp
    logs.add_argument("--log-with-timestamp", "--no-log-hide-timestamp", dest="log_with_timestamp",
                      action="store_const", const=True, help="HOROVOD_LOG_HIDE_TIME=0 (the default)")
    logs.add_argument("--log-without-timestamp", "--log-hide-timestamp", dest="log_with_timestamp",
                      action="store_const", const=False, help="HOROVOD_LOG_HIDE_TIME=1")
    logs.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true",
                      help="mpirun stamps each line of the ranks' output with the time")
    hosts = group("host arguments")
    hosts.add_argument("-H", "--hosts", metavar="NAME:SLOTS,...",
                       help="hosts and their slots (a name alone: one slot; default: localhost:N)")
    hosts.add_argument("-hostfile", "--hostfile", metavar="FILE",
                       help="a file of hosts, a line NAME slots=SLOTS, NAME:SLOTS or NAME")
    hosts.add_argument("--host-discovery-script", metavar="SCRIPT",
                       help="an elastic job's hosts: a program printing HOST or HOST:SLOTS a line")
    for title, flags in ALREADY_SO.items():
        for flag, what in flags.items():
            group(title).add_argument(flag, action="store_true", help=f"taken as it is: {what}")
    for title, flags in REFUSED.items():
        for option_strings, reason in flags.items():
            group(title).add_argument(*option_strings, action=_Refused, reason=reason,
                                      dest=option_strings[-1].lstrip("-").replace("-", "_"))
    return parser


def parse_command_line(argv):
    """hvdtrun's options, horovodrun's names: flags up to the command (after `--` too), the
    command from there on. UsageError names what cannot be taken."""
    parser = build_parser()
    options, unknown = parser.parse_known_args(argv)
    if options.config_file and not unknown:
        path = options.config_file
        try:
            from_file = config_file.flags(path)
        except ValueError as error:
            raise UsageError(str(error)) from None
        try:  # the file's flags first, so that those of the command line win
            options, unknown = parser.parse_known_args([*from_file, *argv])
        except UsageError as error:
            raise UsageError(f"--config-file {path}: {error}") from None
    if unknown:
        known = [flag for action in parser._actions for flag in action.option_strings
                 if action.help != argparse.SUPPRESS]
        nearest = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"; did you mean {nearest[0]}?" if nearest else "; hvdtrun --help lists the flags"
        raise UsageError(f"unknown flag {unknown[0]}{hint}")
    if options.command[:1] == ["--"]:
        options.command = options.command[1:]
    if options.check_build:
        return options
    given = [flag for name, flag in ELASTIC_FLAGS.items() if getattr(options, name) is not None]
    if not is_elastic(options):
        if given:
            raise UsageError(f"{given[0]} is for elastic jobs: it needs --host-discovery-script, or --min-np on "
                             f"fixed hosts")
    elif options.host_discovery_script is not None and (options.hosts or options.hostfile):
        raise UsageError("-H/--hosts and --hostfile name fixed hosts; an elastic job's come from "
                         "--host-discovery-script")
    elif options.min_np and options.max_np and options.min_np > options.max_np:
        raise UsageError(f"--min-np {options.min_np} is more than --max-np {options.max_np}")
    elif options.blacklist_cooldown_range:
        low, high = options.blacklist_cooldown_range
        if not low <= high <= elastic.LONGEST_COOLDOWN_S:
            raise UsageError(f"--blacklist-cooldown-range {low} {high}: MIN must be at most MAX, and MAX at most "
                             f"{elastic.LONGEST_COOLDOWN_S} s")
    if options.num_proc is None and not is_elastic(options):
        raise UsageError("-np/--num-proc is required: the number of ranks to start")
    if not options.command:
        raise UsageError("no command to run (e.g. hvdtrun -np 2 python train.py)")
    if options.hosts and options.hostfile:
        raise UsageError("-H/--hosts and --hostfile both name hosts; give one of them")
    if options.timeline_mark_cycles and not options.timeline_filename:
        raise UsageError("--timeline-mark-cycles marks cycles on the timeline: it needs --timeline-filename")
    return options


def is_elastic(options):
    """Whether the job runs elastically, as horovodrun decides it: with a discovery script, or
    with --min-np (then on the fixed hosts of -H or --hostfile, or this machine)."""
    return options.host_discovery_script is not None or options.min_np is not None


def job_hosts(options):
    """The hosts the job runs on, refused where their slots cannot take -np ranks (or --min-np);
    without -H or --hostfile, this machine. A host named without slots has one, as with mpirun's
    -H."""
    try:
        if options.hosts:
            named, given = parse_hosts(options.hosts, f"-H {options.hosts}"), f"-H {options.hosts}"
        elif options.hostfile:
            named = read_hostfile(options.hostfile, f"--hostfile {options.hostfile}")
            given = None
        else:
            return [Host("localhost", max(n for n in (options.num_proc, options.min_np, options.max_np) if n))]
    except HostsError as error:
        raise UsageError(str(error)) from None
    hosts = [Host(name, slots or 1) for name, slots in named]
    given = given or f"--hostfile {options.hostfile} ({','.join(f'{h.host}:{h.slots}' for h in hosts)})"
    slots = sum(host.slots for host in hosts)
    if (options.num_proc or 0) > slots:
        raise UsageError(f"-np {options.num_proc} asks for {options.num_proc} ranks but {given} "
                         f"offers only {slots} slots")
    if (options.min_np or 0) > slots:  # fixed hosts never offer more
        raise UsageError(f"--min-np {options.min_np} asks for at least {options.min_np} ranks but {given} "
                         f"offers only {slots} slots")
    return hosts


def check_command_and_hosts(command, hosts, extra_args):
    """Refuse, in one line, a job that mpirun would end in a banner per rank or host: a program
    (or Python script) missing on this machine when the job runs only here, a host that does not
    answer the remote agent mpirun would reach it with (horovodrun checks its ssh likewise)."""
    if all_on_this_machine(hosts):
        if shutil.which(command[0]) is None:
            raise UsageError(f"{command[0]}: no such program (not a file, nor on PATH)")
        script = _python_script(command)
        if script is not None and not os.path.isfile(script):
            raise UsageError(f"{script}: no such file, for {os.path.basename(command[0])} to run")
        return
    answering = mpirun.reachable_hosts(hosts, extra_args, os.environ)
    silent = [host.host for host in hosts if host not in answering]
    if silent:
        agent = " ".join(mpirun.remote_agent(extra_args, os.environ))
        raise UsageError(f"host {silent[0]} does not answer `{agent} {silent[0]} true` within "
                         f"{mpirun.PROBE_TIMEOUT_S:g} s" + (f" (nor {', '.join(silent[1:])})" if silent[1:] else ""))


def _python_script(command):
    """The script a `python [flags] script.py ...` command runs, else None."""
    if not os.path.basename(command[0]).startswith("python"):
        return None
    for argument in command[1:]:
        if argument in ("-m", "-c", "-"):
            return None
        if not argument.startswith("-"):
            return argument if argument.endswith(".py") else None
    return None


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
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"{START_TIMEOUT_VARIABLE}={error} (seconds)") from None


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
        "HOROVOD_LOG_HIDE_TIME": None if options.log_with_timestamp is None else not options.log_with_timestamp,
        "HOROVOD_THREAD_AFFINITY": options.thread_affinity,
    }
    return {name: str(int(value)) if isinstance(value, bool) else str(value)
            for name, value in given.items() if value is not None}


def rank_environment(options, hosts):
    env = mpirun.worker_environment(busiest_host_ranks(hosts, options.num_proc))
    # The start timeout is hvdtrun's to keep; on the ranks the engine would report it as a
    # Horovod variable it ignores.
    env.pop(START_TIMEOUT_VARIABLE, None)
    env.update(engine_variables(options))
    if options.network_interfaces:
        env["NCCL_SOCKET_IFNAME"] = ",".join(options.network_interfaces)
    return env


def binding_args(options):
    """How mpirun binds and maps the ranks: --binding-args, split as a shell would, else as
    horovodrun has Open MPI do it."""
    try:
        return shlex.split(options.binding_args) if options.binding_args else mpirun.NO_BINDING
    except ValueError as error:
        raise UsageError(f"--binding-args {options.binding_args!r}: {error}") from None


def mpirun_extra_args(options):
    """mpirun's arguments for hvdtrun's flags, as horovodrun gives them to Open MPI, then
    --mpi-args."""
    try:
        given = shlex.split(options.mpi_args or "")
    except ValueError as error:
        raise UsageError(f"--mpi-args {options.mpi_args!r}: {error}") from None
    # mpirun tags each line with its rank for --output-filename (output_files.py)
    outputs = [*(["tag"] if options.output_filename else []),
               *(["timestamp"] if options.prefix_output_with_timestamp else [])]
    args = ["--output", ",".join(outputs)] if outputs else []
    if options.network_interfaces:
        args += mpirun.interface_args(options.network_interfaces)
    if options.tcp:
        args += ["--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp"]
    ssh_args = [*(["-p", str(options.ssh_port)] if options.ssh_port else []),
                *(["-i", options.ssh_identity_file] if options.ssh_identity_file else [])]
    if ssh_args:
        if mpirun.ssh_parameter("agent", given, {}) or mpirun.ssh_parameter("args", given, {}):
            raise UsageError("--ssh-port and --ssh-identity-file are ssh's, and --mpi-args names mpirun's remote "
                             "agent or its arguments: give them in --mpi-args")
        args += ["--mca", "plm_ssh_args", shlex.join(ssh_args)]
    return args + given


def open_rank_watch(options, hosts, timeout_s):
    try:
        return rank_watch.open_rank_watch(hosts, options.network_interfaces, options.num_proc, timeout_s,
                                          options.verbose)
    except ValueError as error:
        raise UsageError(str(error)) from None


def launch(options, hosts, extra_args, watch, copy_to=None):
    """Runs the job; returns hvdtrun's exit status. `copy_to`: see run_job."""
    env = rank_environment(options, hosts)
    program = [sys.executable, "-m", "hvdtrain.launch.hvdtrun.rank_start", ",".join(watch.addresses),
               str(watch.listener.getsockname()[1]), "--", *options.command]
    command = mpirun.mpirun_command(program, hosts, num_proc=options.num_proc, env=env, extra_args=extra_args,
                                    binding=binding_args(options))
    if options.verbose:
        print(f"hvdtrun: starting {options.num_proc} ranks: {shlex.join(command)}", file=sys.stderr, flush=True)
    # A scheduler's SIGTERM stops the ranks too, and so does SIGINT (the start timeout's too) where
    # the shell started us in the background, which leaves SIGINT ignored
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, signal.default_int_handler)
    if options.output_filename:
        copy_to = [output_files.RankOutput(options.output_filename, options.num_proc, console)
                   for console in copy_to or (sys.stdout, sys.stderr)]
    watching = rank_watch.start_watching(watch)
    try:
        result = mpirun.run(command, env=env, copy_to=copy_to)
        rank_watch.job_ended(watch, watching)
    except KeyboardInterrupt:
        if watch.missing:
            print(f"hvdtrun: {len(watch.missing)} of {options.num_proc} ranks had not started after "
                  f"{watch.timeout_s} s (rank {rank_watch.describe_ranks(watch.missing)}); the job was stopped. "
                  f"Check that the hosts can be reached, or give more time with --start-timeout", file=sys.stderr)
            return 1
        print("hvdtrun: interrupted; the job was stopped", file=sys.stderr)
        return 130
    finally:
        for stream in copy_to if options.output_filename else ():
            stream.close()
    # mpirun killed by a signal: the status a shell would report
    return result.returncode if result.returncode >= 0 else 128 - result.returncode


def every_rank_ended(watch, status):
    """`status`, or, where mpirun ended with 0 but some rank's process did not end with it,
    EXIT_COMMUNICATION, saying which ranks."""
    try:
        not_ended = rank_watch.ranks_not_ended(watch) if status == 0 else {}
    except KeyboardInterrupt:  # the job has ended; hvdtrun was waiting for a rank's end to arrive
        print("hvdtrun: interrupted", file=sys.stderr)
        return 130
    if not not_ended:
        return status
    described = [f"{rank} ({'never started' if address is None else 'from ' + address})"
                 for rank, address in not_ended.items()]
    print(f"hvdtrun: mpirun ended with status 0, but {'rank' if len(described) == 1 else 'ranks'} "
          f"{rank_watch.describe_ranks(described)} had not ended (mpirun ends so when it loses a host; or a process "
          f"the rank started outlives it, holding its connection to hvdtrun); the job failed",
          file=sys.stderr, flush=True)
    return EXIT_COMMUNICATION


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
        if options.check_build:
            print(check_build_report())
            sys.exit(0)
        sys.exit(run_job(options))
    except UsageError as error:
        print(f"hvdtrun: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


def run_job(options, copy_to=None):
    """Runs the job of `options`, plain or elastic, and returns hvdtrun's exit status; UsageError
    where it is refused before it starts. `copy_to`: None, or the (stdout, stderr) text streams
    the ranks' output is copied into, where this process's own are not its descriptors 1 and 2
    (a notebook's)."""
    problem = mpirun.environment_problem({**os.environ, **engine_variables(options)})
    if problem:
        raise UsageError(problem)
    extra_args = mpirun_extra_args(options)
    timeout_s = start_timeout_s(options, os.environ)
    if is_elastic(options):
        return run_elastically(options, extra_args, timeout_s, copy_to)
    hosts = job_hosts(options)
    check_command_and_hosts(options.command, hosts, extra_args)
    watch = open_rank_watch(options, hosts, timeout_s)
    try:
        return every_rank_ended(watch, launch(options, hosts, extra_args, watch, copy_to))
    finally:
        watch.close()


def run_elastically(options, extra_args, timeout_s, copy_to=None):
    """The elastic mode (elastic.py): each start of the job is one `launch`, of the ranks the
    hosts found then can take."""
    settings = elastic.ElasticOptions(
        discovery_script=options.host_discovery_script,
        min_np=options.min_np or options.num_proc or 1,
        max_np=options.max_np,
        slots_per_host=options.slots_per_host or 1,
        reset_limit=options.reset_limit,
        elastic_timeout_s=options.elastic_timeout or DEFAULT_ELASTIC_TIMEOUT_S,
        blacklist_cooldown_s=options.blacklist_cooldown_range,
        fixed_hosts=() if options.host_discovery_script else tuple(job_hosts(options)))

    # Whether a job ended with its work done the driver asks the commit store (whether rank 0's
    # hvd.elastic.run returned), which says more than whether the ranks' processes ended.
    def start_job(num_proc, hosts):
        job_options = copy.copy(options)
        job_options.num_proc = num_proc
        watch = open_rank_watch(job_options, hosts, timeout_s)
        try:
            return launch(job_options, hosts, extra_args, watch, copy_to)
        finally:
            watch.close()

    def answering(hosts):
        return mpirun.reachable_hosts(hosts, extra_args, os.environ)

    addresses = rank_watch.interface_addresses(options.network_interfaces) or rank_watch.interface_addresses([])
    return elastic.run_elastic(settings, start_job, addresses, answering)


if __name__ == "__main__":
    main()
