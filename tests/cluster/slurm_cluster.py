"""A real Slurm cluster on this one machine, for tests that submit jobs the way a user does.

`slurm_cluster(work_dir)` builds it and removes all of it when its block ends, also on an error
or Ctrl-C:

- munged with a key made for this cluster; its key, socket and log lie in work_dir, and every
  daemon and client uses that socket (AuthInfo=socket=..., which auth/munge and cred/munge both
  read), so the machine's own munge setup, if any, plays no part.
- One slurmd per host: a network namespace made by netns_cluster.py, joined to a bridge in the
  root namespace. Each slurmd runs in a UTS namespace of its own whose hostname is its Slurm node
  name, so `hostname` in a job prints a name of SLURM_JOB_NODELIST. The node names are the
  namespaces' names, unique to each cluster. slurm.conf gives each node's address (NodeAddr), so
  Slurm and Open MPI need no name to resolve; jobs still get node names that resolve, as on a
  real cluster, from a hosts file of this cluster bind-mounted over /etc/hosts in a mount
  namespace of each slurmd (which its jobs inherit). The machine's /etc/hosts stays as it is.
- slurmctld in the root namespace, reached at the bridge's address, in a UTS namespace whose
  hostname is the SlurmctldHost of slurm.conf (slurmctld refuses to run on a host of another
  name). The root namespace is the "login node": client commands run there with SLURM_CONF
  pointing at this cluster's slurm.conf (sbatch passes it on to jobs, as every SLURM_* variable).
- All hosts see the whole file system of this machine, as the nodes of a cluster with a shared
  home directory do (the private directory of the netns agent, which hides a directory from the
  hosts of the cluster tests, is not used): a job's script, its output and the Python
  environment are found on every node. Only TmpFS, where Slurm's PMIx plugin puts each step's
  files, is a directory per node, since those files have the same names on every node.

Nothing needs systemd or cgroups: job processes are tracked by their parentage
(proctrack/linuxproc), so a process whose parent dies (orphaned ranks of a killed mpirun) leaves
the job's tracking and lives on until it ends or the cluster goes.
"""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Tuple

from netns_cluster import missing_requirements as missing_netns_requirements, netns_cluster

SLURM_PROGRAMS = ("slurmctld", "slurmd", "slurmstepd", "munged", "mungekey",
                  "sbatch", "srun", "salloc", "scontrol", "scancel", "squeue", "sinfo")
# slurmctld holds a requeued job back for cred_expire seconds (120 by default), so that no step
# credential of its previous run can still launch anything; 5 s lets it run again promptly.
CRED_EXPIRE_S = 5
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10


def missing_requirements():
    """Why a Slurm cluster cannot be made here, in one line, or None where it can."""
    missing = missing_netns_requirements()
    if missing:
        return missing
    absent = [program for program in SLURM_PROGRAMS if program_path(program) is None]
    if absent:
        return f"Slurm or munge is not installed ({', '.join(absent)} not found): run scripts/install_test_packages.sh as root"
    if program_path("nsenter") is None:
        return "the Slurm hosts need nsenter (util-linux) on PATH"
    return None


def program_path(name):
    # The daemons live in /usr/sbin, which a non-login shell may not have on its PATH.
    for directory in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin"]:
        candidate = Path(directory or ".", name)
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@dataclass(frozen=True)
class SlurmNode:
    name: str  # the Slurm node name, also the hostname its processes see
    address: str  # NodeAddr: the address of its network namespace
    namespace: str  # the network namespace its slurmd runs in


@dataclass
class SlurmCluster:
    nodes: Tuple[SlurmNode, ...]
    conf_path: Path
    env: Dict[str, str]  # what client commands need: this process's environment with SLURM_CONF set
    work_dir: Path
    output_dir: Path  # where submit() runs sbatch: its jobs start there and write slurm-<id>.out there
    log_files: Dict[str, Path] = field(default_factory=dict)  # daemon name: its log

    @property
    def node_names(self):
        return [node.name for node in self.nodes]

    def run(self, *command, timeout=30, check=True, env=None, **options):
        """Run a client command (sbatch, srun, salloc, scontrol, ...) on the login node with this
        cluster's environment; returns its CompletedProcess (stdout and stderr together, as text).
        A command still running after `timeout` seconds is ended with all it started, and
        subprocess.TimeoutExpired is raised."""
        return run_bounded(list(command), timeout, check, env={**self.env, **(env or {})}, **options)

    def submit(self, script, *sbatch_options, timeout=30):
        """Submit a batch script, given as its text, from output_dir; returns the job id."""
        script_path = self.output_dir / f"job-{time.time_ns()}.sh"
        script_path.write_text(script)
        result = self.run("sbatch", "--parsable", *sbatch_options, str(script_path), cwd=self.output_dir,
                          timeout=timeout)
        return result.stdout.strip().split(";")[0]

    def output(self, job_id):
        """What a job of submit() wrote to its default output file, slurm-<id>.out ("" before it exists)."""
        path = self.output_dir / f"slurm-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def job(self, job_id):
        """The job's fields as `scontrol show job` gives them (JobState, ExitCode, Restarts, ...)."""
        text = self.run("scontrol", "--oneliner", "show", "job", str(job_id)).stdout
        return dict(word.split("=", 1) for word in text.split() if "=" in word)

    def wait_for_job_state(self, job_id, *states, timeout=60):
        """Wait until the job's JobState is one of `states` (RUNNING, COMPLETED, ...); returns
        its fields then. Raises TimeoutError, with its output and the daemons' logs, if not."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.get("JobState") in states:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} did not reach {' or '.join(states)} within {timeout} s: "
                                   f"{job}\n--- its output ---\n{self.output(job_id)}\n{self.log_tails()}")
            time.sleep(0.1)

    def log_tails(self, lines=20):
        tails = []
        for name, path in self.log_files.items():
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no log)"]
            tails.append(f"--- {name}: {path} ---\n" + "\n".join(text))
        return "\n".join(tails)


def run_bounded(command, timeout, check, **options):
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, **options)
    try:
        stdout, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_session(process)
        raise subprocess.TimeoutExpired(command, timeout, output=process.communicate()[0]) from None
    except BaseException:  # Ctrl-C
        end_session(process)
        raise
    if check and process.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed (exit {process.returncode}):\n{stdout}")
    return subprocess.CompletedProcess(command, process.returncode, stdout)


def end_session(process, grace_s=3):
    """End a client command and all it started on the login node. salloc runs its command in a
    process group of its own, so the whole session goes; SIGTERM first, on which salloc and srun
    give their allocation back (a killed one leaves it to run on), then SIGKILL."""
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal_number)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)


def session_members(session_id):
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # Fields after the command name (which may hold spaces): state, ppid, pgrp, session.
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == session_id:
                members.append(int(stat.parent.name))
    return members


def free_port():
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def die_with_parent():
    """Run in a daemon's process before its exec: the daemon gets SIGKILL when the process that
    started it dies, so that a test run killed without cleaning up leaves no daemon behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def slurm_cluster(work_dir, node_count=2, kill_wait_s=30, cpus_per_node=2, debug_level="info"):
    """A SlurmCluster of `node_count` nodes with all its files in `work_dir` (an existing
    directory), removed with every process of it when the block ends. Each node has
    `cpus_per_node` CPUs (they share this machine's cores); KillWait, the seconds between a
    job's SIGTERM and SIGKILL, is `kill_wait_s`; the daemons log at `debug_level`."""
    work_dir = Path(work_dir).resolve()
    daemons = []  # the Popen objects of munged, slurmctld and the slurmds, in the order started
    removal = contextlib.ExitStack()
    try:
        hosts = removal.enter_context(netns_cluster(node_count, work_dir))
        # slurmstepd makes Unix sockets in the nodes' spool directories, and a socket's path
        # may not exceed 108 bytes: under a pytest temporary directory (deeper still in an xdist
        # worker's) the job's step fails to start, so the spool lies in a short one of its own.
        spool = Path(removal.enter_context(tempfile.TemporaryDirectory(prefix="slurm-spool-")))
        removal.callback(stop_processes, daemons, hosts.hosts)
        yield start_cluster(work_dir, spool, hosts, daemons, kill_wait_s, cpus_per_node, debug_level)
    finally:
        # A second Ctrl-C must not cut the removal short: it is held until the removal is done.
        with signals_held(signal.SIGINT, signal.SIGTERM):
            removal.close()


@contextlib.contextmanager
def signals_held(*signal_numbers):
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signal_numbers)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_cluster(work_dir, spool, hosts, daemons, kill_wait_s, cpus_per_node, debug_level):
    nodes = tuple(SlurmNode(host.namespace, host.address, host.namespace) for host in hosts.hosts)
    cluster_name = nodes[0].name.rsplit("n", 1)[0]  # the namespaces' tag, "hvt<hex>"
    controller_name = f"{cluster_name}ctl"
    controller_address = hosts.subnet.rsplit(".", 1)[0] + ".1"  # the bridge's
    environment = client_environment(work_dir / "slurm.conf", work_dir / "job-tmp")
    cluster = SlurmCluster(nodes, work_dir / "slurm.conf", environment, work_dir, work_dir / "jobs")
    for directory in ("state", "log", "jobs", "job-tmp", "munge", *(f"tmp/{node.name}" for node in nodes)):
        (work_dir / directory).mkdir(mode=0o700, parents=True, exist_ok=True)
    for node in nodes:
        (spool / node.name).mkdir(mode=0o700)
    munge_socket = start_munged(work_dir / "munge", daemons, cluster.log_files)
    (work_dir / "plugstack.conf").write_text("")  # no SPANK plugins of the machine's /etc/slurm
    cluster.conf_path.write_text(slurm_conf(cluster_name, controller_name, controller_address, nodes, work_dir, spool,
                                            munge_socket, kill_wait_s, cpus_per_node, debug_level))
    hosts_file = work_dir / "hosts"
    hosts_file.write_text(Path("/etc/hosts").read_text().rstrip("\n") + "\n" + "".join(
        f"{address} {name}\n" for address, name in
        [(controller_address, controller_name)] + [(node.address, node.name) for node in nodes]))

    cluster.log_files["slurmctld"] = work_dir / "log" / "slurmctld.log"
    daemons.append(start_daemon(
        ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', controller_name,
         program_path("slurmctld"), "-D", "-f", str(cluster.conf_path)],
        cluster.log_files["slurmctld"], cluster.env))
    for node in nodes:
        cluster.log_files[f"slurmd {node.name}"] = work_dir / "log" / f"slurmd-{node.name}.log"
        daemons.append(start_daemon(
            ["nsenter", f"--net=/run/netns/{node.namespace}", "unshare", "--uts", "--mount", "--propagation",
             "private", "sh", "-c", 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"',
             node.name, str(hosts_file), program_path("slurmd"), "-D", "-N", node.name, "-f",
             str(cluster.conf_path)],
            work_dir / "log" / f"slurmd-{node.name}.stderr", cluster.env))
    wait_until_idle(cluster, daemons)
    return cluster


def start_munged(munge_dir, daemons, log_files):
    """munged with a key of its own; returns the path of its socket."""
    key = munge_dir / "munge.key"
    subprocess.run([program_path("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
    socket_path = munge_dir / "munge.socket"
    log_files["munged"] = munge_dir / "munged.log"
    # --force: munged wants every directory above its socket to be searchable by all users, and
    # pytest's temporary directories lie under a /tmp that root alone may search here.
    # In the foreground munged logs to its stderr, not to its --log-file.
    daemons.append(start_daemon(
        [program_path("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}",
         f"--pid-file={munge_dir / 'munged.pid'}", f"--seed-file={munge_dir / 'munged.seed'}"],
        log_files["munged"], os.environ))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not socket_path.exists():
        if daemons[-1].poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"munged did not start:\n{log_files['munged'].read_text(errors='replace')}")
        time.sleep(0.02)
    return socket_path


def start_daemon(command, stderr_path, env):
    """A daemon in the foreground, its output to `stderr_path` (a slurmd logs there also what
    goes wrong before its log file is open). It runs in a session of its own, so that a Ctrl-C
    at the terminal reaches the tests and not the daemons, which then go in order."""
    with open(stderr_path, "wb") as stderr:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)


def client_environment(conf_path, job_tmp):
    # The variables of a Slurm job that these tests might themselves run in would point
    # sbatch, srun and salloc at that job and its cluster. Jobs inherit TMPDIR, so that what
    # their processes leave there (the session directory of a killed mpirun daemon) goes with
    # the cluster rather than lies in /tmp for a later daemon of the same pid to trip over.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = str(conf_path)
    env["TMPDIR"] = str(job_tmp)
    return env


def slurm_conf(cluster_name, controller_name, controller_address, nodes, work_dir, spool, munge_socket, kill_wait_s,
               cpus_per_node, debug_level):
    node_lines = "".join(f"NodeName={node.name} NodeAddr={node.address} NodeHostname={node.name}\n"
                         for node in nodes)
    # SlurmctldLogFile is left out: slurmctld -D logs to its stderr. SlurmdLogFile is needed
    # for slurmstepd, which has no stderr and would otherwise log to syslog.
    return f"""\
ClusterName={cluster_name}
SlurmctldHost={controller_name}({controller_address})
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire={CRED_EXPIRE_S}
StateSaveLocation={work_dir}/state
SlurmdSpoolDir={spool}/%n
TmpFS={work_dir}/tmp/%n
SlurmctldPidFile={work_dir}/state/slurmctld.pid
SlurmdPidFile={spool}/%n/slurmd.pid
SlurmdLogFile={work_dir}/log/slurmd-%n.log
SlurmctldDebug={debug_level}
SlurmdDebug={debug_level}
PlugStackConfig={work_dir}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
# The main scheduling pass every second, not every 60 s: it is what starts a requeued job once
# its begin time has come.
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The nodes share this machine's cores: a node may claim more than it has.
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait={kill_wait_s}
MinJobAge=600
MailProg=/bin/true
NodeName=DEFAULT CPUs={cpus_per_node} RealMemory=100 State=UNKNOWN
{node_lines}PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def wait_until_idle(cluster, daemons):
    deadline = time.monotonic() + START_TIMEOUT_S
    states = {}
    while time.monotonic() < deadline:
        exited = [" ".join(process.args) for process in daemons if process.poll() is not None]
        if exited:
            raise RuntimeError(f"a Slurm daemon exited at start: {exited}\n{cluster.log_tails()}")
        result = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False, timeout=10)
        if result.returncode == 0:
            states = dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2)
            if all(states.get(name) == "idle" for name in cluster.node_names):
                return
        time.sleep(0.1)
    raise RuntimeError(f"the Slurm nodes were not idle within {START_TIMEOUT_S} s (their states: {states})\n"
                       f"{cluster.log_tails()}")


def stop_processes(daemons, hosts):
    """Stop the daemons, then every process left in their sessions (slurmctld's slurmscriptd)
    and in the hosts' namespaces (slurmstepd, jobs, orphans of jobs); wait until all are gone."""
    for process in reversed(daemons):
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in reversed(daemons):
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    killed = set()
    while True:
        left = [pid for host in hosts for pid in host.processes()] + [
            pid for process in daemons for pid in session_members(process.pid)]
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(left)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {left} of the Slurm hosts did not end")
        time.sleep(0.05)
    # slurmstepds are children of init, which reaps the dead ones soon: wait for that too, so
    # that no "[slurmstepd] <defunct>" is seen after the block.
    while time.monotonic() < deadline and (any(Path(f"/proc/{pid}").exists() for pid in killed)
                                           or dead_slurmstepds()):
        time.sleep(0.05)


def dead_slurmstepds():
    dead = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if stat.read_text().startswith(f"{stat.parent.name} (slurmstepd) Z"):
                dead.append(int(stat.parent.name))
    return dead
