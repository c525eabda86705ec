"""Several hosts on this one machine, so that hvdtrain runs across hosts for real: what the cluster
tests (conftest.py) and the calibration of the scaling model (scripts/calibrate_scaling.py, which
imports this file by its path) build their hosts with.

Each host is a network namespace, joined by a veth pair to a bridge in the root namespace; the
bridge and the hosts share a /24 of their own per cluster (bridge .1, hosts .2, .3, ...). mpirun
runs in the root namespace and starts its daemons on the hosts with netns_agent.sh in place of
ssh; the hosts are named by their addresses, so /etc/hosts stays as it is. `netns_cluster` makes
everything and removes it when its block ends, also on an error or Ctrl-C.

The hosts share no file system in one directory, the cluster's private directory: every host but
the first sees an empty tmpfs over it (the agent mounts it), so that a job that needs a file
written on another host fails. The first host sees this machine's files, as the host where a job
is launched does.
"""

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

from hvdtrain.launch.mpirun import session_members

AGENT = Path(__file__).resolve().with_name("netns_agent.sh")


def ip(*args):
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True)
class NetnsHost:
    namespace: str
    address: str
    link: str  # the root-namespace end of the host's veth pair; the host's own end is eth0

    def netns_inode(self):
        """What /proc/self/ns/net of a process on this host stats to."""
        return os.stat(f"/run/netns/{self.namespace}").st_ino

    def traffic_bytes(self):
        """(received, sent) bytes of this host so far (its link's root-namespace end counts them crosswise)."""
        statistics = Path("/sys/class/net") / self.link / "statistics"
        return int((statistics / "tx_bytes").read_text()), int((statistics / "rx_bytes").read_text())

    def processes(self):
        return [int(pid) for pid in ip("netns", "pids", self.namespace).split()]

    def kill_processes(self):
        """Kill every process on this host at once, as a machine that goes down."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def with_own_hostname(self, command):
        """`command` run on this host in a UTS namespace of its own, whose hostname is the host's
        namespace's name (for daemons that the tests start on the host themselves)."""
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.namespace, *command]


@dataclass(frozen=True)
class NetnsCluster:
    hosts: Tuple[NetnsHost, ...]
    subnet: str
    private_dir: Path  # what every host but the first sees empty

    def mpirun_args(self):
        """What mpirun needs to reach the hosts: the agent (told which directory to hide from which
        hosts), and the bridge for the daemons' (OOB) and the ranks' (TCP BTL) traffic. Ranks on one
        host use shared memory; ob1 with just these transports makes sure that traffic between hosts
        goes over TCP through the bridge."""
        agent = f"{AGENT} {self.private_dir} {self.hosts[0].address}"  # Open MPI splits it at spaces
        return ["--mca", "plm_ssh_agent", agent,
                "--mca", "oob_tcp_if_include", self.subnet,
                "--mca", "btl_tcp_if_include", self.subnet,
                "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp"]


def missing_requirements():
    """Why network-namespace hosts cannot be made here, in one line, or None where they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return f"network-namespace hosts need {' and '.join(missing)} (iproute2, util-linux) on PATH"
    return None


def free_subnet():
    """A 10.x.y.0/24 that no address or route of this machine uses yet."""
    in_use = ip("-4", "-o", "addr", "show") + ip("-4", "route", "show")
    while True:
        prefix = f"10.{random.randrange(1, 255)}.{random.randrange(256)}."
        if prefix not in in_use:
            return prefix


@contextlib.contextmanager
def netns_cluster(host_count, private_dir):
    """A NetnsCluster of `host_count` hosts, removed when the block ends. Every host but the first
    sees `private_dir` empty; what every host runs (the repository, the Python environment) must
    lie outside it."""
    if " " in str(private_dir) or " " in str(AGENT):
        raise RuntimeError(f"Open MPI's agent cannot be given {AGENT} {private_dir}: a path has a space")
    # Names unique to this cluster (interface names have at most 15 characters), so that two
    # clusters at once, or the remains of one whose maker was killed, cannot clash.
    tag = f"hvt{secrets.token_hex(3)}"
    prefix = free_subnet()
    bridge = f"{tag}br"
    hosts = tuple(NetnsHost(f"{tag}n{i}", f"{prefix}{i + 2}", f"{tag}v{i}") for i in range(host_count))
    undo = []  # `ip` commands that remove what was made, in the order it was made
    try:
        ip("link", "add", bridge, "type", "bridge")
        undo.append(("link", "del", bridge))
        ip("addr", "add", f"{prefix}1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        for host in hosts:
            ip("netns", "add", host.namespace)
            undo.append(("netns", "del", host.namespace))
            ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            # Deleting a namespace frees its links only later; this removes the pair at once.
            undo.append(("link", "del", host.link))
            ip("link", "set", host.link, "master", bridge, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.namespace, "link", "set", "eth0", "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
        yield NetnsCluster(hosts, f"{prefix}0/24", Path(private_dir))
    finally:
        remove_cluster(hosts, undo)


def free_port(address):
    """A TCP port on `address` that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def start_daemon(command, env, log):
    """`command` in a session of its own (so that `kill_daemon` finds all it starts), its output in `log`."""
    with open(log, "w") as output:
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_daemon(process):
    """Kill a `start_daemon` process and everything in its session at once."""
    for pid in [process.pid] + session_members(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def remove_cluster(hosts, undo):
    errors = []
    for host in hosts:
        # Only this cluster's jobs ever ran in the namespace: what is left of them goes.
        with contextlib.suppress(RuntimeError):  # unless the namespace was never made
            host.kill_processes()
    for command in reversed(undo):
        try:
            ip(*command)
        except RuntimeError as error:
            errors.append(str(error))
    if errors:
        raise RuntimeError("could not remove the network-namespace cluster: " + "; ".join(errors))
