"""Where the ranks run: the hosts of a cluster layout, whether we already are inside a job, and
the hosts of the job we are in.

A layout (conf/cluster/*.yaml) says how many hosts and how many ranks (slots) per host. The host
names come from `cluster.hosts` or `cluster.hostfile` (one of them), else from the Slurm
allocation (SLURM_JOB_NODELIST, in Slurm's compressed form `node[01-04,07]`, except for the
layout `local`); a one-host layout without any of them runs on this machine. As with mpirun's
and horovodrun's `-H` and `--hostfile`, hosts given are a pool the layout takes its hosts from
in order, and they are used with every layout, `local` included: a user who names hosts means
the ranks to run there, and `local` stands for this machine only when nothing names another.
"""

import collections
import os
import re
import socket
from pathlib import Path

from hvdtrain.runner.config import invalid
from hvdtrain.runner.launcher import Host


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
    if cluster.hosts:
        return "cluster.hosts", [_host_entry(entry, "cluster.hosts") for entry in cluster.hosts]
    if cluster.hostfile:
        return f"cluster.hostfile={cluster.hostfile}", read_hostfile(cluster.hostfile)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    # `local` is not taken to the allocation's nodes: inside a batch job it means the node the
    # job script runs on, whatever the allocation's task counts say.
    if nodelist and cluster.name != "local":
        names = expand_nodelist(nodelist)
        counts = env.get("SLURM_TASKS_PER_NODE")
        slots = expand_counts(counts) if counts else [None] * len(names)
        return f"the Slurm allocation {nodelist}", list(zip(names, slots))
    return None, []


def _host_entry(entry, where):
    name, _, slots = str(entry).strip().partition(":")
    if not name or (slots and not slots.isdigit()):
        raise invalid(f"{where}: {entry!r} is not a host; allowed: 'name' or 'name:slots'")
    return name, int(slots) if slots else None


def read_hostfile(path):
    """Hosts of an MPI hostfile: one per line, `name`, `name slots=N` or `name:N`; # comments.
    Any other field is refused rather than skipped: a misspelt `slots` would otherwise leave the
    host's capacity unchecked."""
    if not Path(path).is_file():
        raise invalid(f"cluster.hostfile={path!r}: no such file")
    hosts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"cluster.hostfile={path} line {number}"
        name, *fields = line.split()
        if len(fields) > 1 or (fields and not fields[0].startswith("slots=")):
            field = next((field for field in fields if not field.startswith("slots=")), fields[-1])
            raise invalid(f"{where}: unexpected field {field!r}; a host line is 'name', 'name slots=N' or 'name:N'")
        entry = f"{name}:{fields[0].removeprefix('slots=')}" if fields else name
        hosts.append(_host_entry(entry, where))
    return hosts


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


def inside_existing_job(env=None):
    """Whether this process already is a rank of an MPI job (started by mpirun, or by srun with
    several tasks). A single-task srun step (an interactive shell) is not a job to train in:
    from there, hvdtrain launches its own."""
    env = os.environ if env is None else env
    if any(name in env for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK")):
        return True
    if "PMIX_RANK" in env or ("SLURM_STEP_ID" in env and "SLURM_PROCID" in env):
        return int(env.get("SLURM_STEP_NUM_TASKS", "2")) > 1
    return False


def job_hosts():
    """Inside a running job (after init): its hosts and the number of ranks on each, in rank order."""
    from hvdtrain import core  # only a running job needs the engine, not the `hvdtrain` command

    counts = collections.Counter(core.allgather_object(socket.gethostname(), name="hostname"))
    return [Host(name, slots) for name, slots in counts.items()]


def all_on_this_machine(hosts):
    here = ("localhost", "127.0.0.1", socket.gethostname(), socket.gethostname().split(".")[0])
    return all(host.host in here for host in hosts)

