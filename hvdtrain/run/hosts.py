"""Hosts: the one grammar both commands read them in, the hosts of a cluster layout, the hosts of
a running job, and whether a host is this machine.

A host is written `NAME` or `NAME:SLOTS` (`cluster.hosts`, hvdtrun's `-H`, each line a host
discovery script prints), and a hostfile has one host a line in Horovod's and Open MPI's form
`NAME slots=SLOTS`, or `NAME:SLOTS`, or `NAME` alone, with `#` comments. A host without slots
offers what its reader gives it: the layout's slots for `hvdtrain`, one slot for `hvdtrun` (as
mpirun's -H), `--slots-per-host` for a discovery script. Any other field is refused rather than
skipped: a misspelt `slots` would otherwise leave the host's capacity unchecked.

A layout (conf/cluster/*.yaml, or any HOSTSxSLOTS) says how many hosts and how many ranks (slots)
per host. The host names come from `cluster.hosts` or `cluster.hostfile` (one of them), else from
the Slurm allocation (SLURM_JOB_NODELIST, in Slurm's compressed form `node[01-04,07]`, except for
the layout `local`); a one-host layout without any of them runs on this machine. As with mpirun's
and horovodrun's `-H` and `--hostfile`, hosts given are a pool the layout takes its hosts from in
order, and they are used with every layout, `local` included: a user who names hosts means the
ranks to run there, and `local` stands for this machine only when nothing names another.
"""

import collections
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from hvdtrain.run.config import invalid

HOST_FORMS = "NAME, NAME:SLOTS or NAME slots=SLOTS"


@dataclass(frozen=True)
class Host:
    host: str
    slots: int


class HostsError(ValueError):
    """Hosts that cannot be read; the message names the entry, or the file and line."""


def parse_host(text, where):
    """(name, slots or None) of one host written `NAME` or `NAME:SLOTS`; `where` names its place
    in the refusal."""
    name, colon, slots = str(text).strip().partition(":")
    if not name or any(c.isspace() for c in name) or (colon and not (slots.isdigit() and int(slots) >= 1)):
        raise HostsError(f"{where}: {text!r} is not a host; a host is NAME or NAME:SLOTS (SLOTS at least 1)")
    return name, int(slots) if slots else None


def parse_hosts(text, where):
    """The hosts of a comma-separated list (hvdtrun's -H)."""
    return [parse_host(entry, where) for entry in text.split(",")]


def read_hostfile(path, where):
    """The hosts of a hostfile, in its order, as [(name, slots or None)]."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise HostsError(f"{where}: no such file") from None
    except OSError as error:
        raise HostsError(f"{where}: {error.strerror or error}") from None
    hosts = []
    for number, line in enumerate(lines, start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, *fields = line.split()
        if fields:
            if len(fields) > 1 or not fields[0].startswith("slots="):
                unexpected = next((field for field in fields if not field.startswith("slots=")), fields[-1])
                raise HostsError(f"{where} line {number}: unexpected field {unexpected!r}; a line is {HOST_FORMS}")
            name = f"{name}:{fields[0].removeprefix('slots=')}"
        hosts.append(parse_host(name, f"{where} line {number}"))
    if not hosts:
        raise HostsError(f"{where}: names no host")
    return hosts


def on_this_machine(name):
    """Whether host `name` is this machine (a rank there needs no remote agent)."""
    here = socket.gethostname()
    return name in ("localhost", "127.0.0.1", here, here.split(".")[0])


def resolve_hosts(cluster, env=None, dry_run=False):
    """The layout's hosts, each with the layout's slots; ConfigError if they cannot be had. A dry
    run (the plan only) of a multi-host layout without hosts names them `<host0>`, `<host1>`, ...:
    placeholders that no machine is called, so the plan cannot be mistaken for one to launch."""
    env = os.environ if env is None else env
    source, offered = _offered_hosts(cluster, env)
    if source is None:
        if cluster.num_hosts == 1:
            source, offered = "this machine", [("localhost", None)]
        elif dry_run:
            source, offered = "the dry run", [(f"<host{i}>", None) for i in range(cluster.num_hosts)]
        else:
            raise invalid(
                f"cluster={cluster.name} needs {cluster.num_hosts} hosts but none were given: set "
                f"cluster.hosts=[host1,host2,...], cluster.hostfile=PATH, or run inside a Slurm allocation")
    if len(offered) < cluster.num_hosts:
        raise invalid(
            f"cluster={cluster.name} needs {cluster.num_hosts} hosts but {source} gives {len(offered)}: "
            f"{', '.join(name for name, _ in offered)}")
    hosts = offered[:cluster.num_hosts]
    for name, slots in hosts:
        if slots is not None and slots < cluster.slots:
            raise invalid(
                f"cluster={cluster.name} asks {cluster.slots} slots (ranks) per host but host {name} offers "
                f"{slots} (from {source}); use a layout with fewer slots or set cluster.slots={slots}")
    return [Host(name, cluster.slots) for name, _ in hosts]


def _offered_hosts(cluster, env):
    """(where the hosts come from, [(name, slots or None)]), or (None, []) when nothing names any."""
    if cluster.hosts and cluster.hostfile:
        raise invalid(f"cluster.hosts={list(cluster.hosts)} and cluster.hostfile={cluster.hostfile!r} both name "
                      f"hosts; give one of them")
    try:
        if cluster.hosts:
            return "cluster.hosts", [parse_host(entry, "cluster.hosts") for entry in cluster.hosts]
        if cluster.hostfile:
            return (f"cluster.hostfile={cluster.hostfile}",
                    read_hostfile(cluster.hostfile, f"cluster.hostfile={cluster.hostfile!r}"))
    except HostsError as error:
        raise invalid(str(error)) from None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    # `local` is not taken to the allocation's nodes: inside a batch job it means the node the
    # job script runs on, whatever the allocation's task counts say.
    if nodelist and cluster.name != "local":
        names = expand_nodelist(nodelist)
        counts = env.get("SLURM_TASKS_PER_NODE")
        slots = expand_counts(counts) if counts else [None] * len(names)
        return f"the Slurm allocation {nodelist}", list(zip(names, slots))
    return None, []


def expand_nodelist(nodelist):
    """Slurm's compressed host list to names: 'gpu[01-03,07],login' -> gpu01 gpu02 gpu03 gpu07 login.
    Several bracket groups in one name expand to every combination, as Slurm does."""
    names = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):
        expanded = [""]
        for text, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            expanded = [done + text + number for done in expanded for number in _expand_ranges(ranges)]
        names.extend(expanded)
    return names


def _expand_ranges(ranges):
    if not ranges:
        return [""]
    numbers = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        width = len(low)
        numbers.extend(f"{n:0{width}d}" for n in range(int(low), int(high or low) + 1))
    return numbers


def expand_counts(counts):
    """Slurm's compressed counts per node: '4(x2),2' -> [4, 4, 2]."""
    result = []
    for part in counts.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise invalid(f"cannot read the Slurm task counts SLURM_TASKS_PER_NODE={counts!r}")
        result += [int(match.group(1))] * int(match.group(2) or 1)
    return result


def job_hosts():
    """Inside a running job (after init): its hosts and the number of ranks on each, in rank order."""
    from hvdtrain import core  # only a running job needs the engine, not the `hvdtrain` command

    counts = collections.Counter(core.allgather_object(socket.gethostname(), name="hostname"))
    return [Host(name, slots) for name, slots in counts.items()]


def all_on_this_machine(hosts):
    return all(on_this_machine(host.host) for host in hosts)


def threads_per_rank(ranks_on_host, cores=None):
    """Each rank's share of a host's cores, for its math libraries' threads: ranks sharing a
    machine must not oversubscribe it with threads."""
    if cores is None:
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, ranks_on_host))
