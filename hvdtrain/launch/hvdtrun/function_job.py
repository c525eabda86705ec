"""`hvdtrun.run`: Horovod 0.28's `horovod.run` for hvdtrain. It runs a Python function on every
rank of a job that hvdtrun starts, and returns what each rank's call returned, in rank order:

    from hvdtrain.launch import hvdtrun

    def train(epochs):
        import hvdtrain.torch as hvd
        hvd.init()
        ...
        return hvd.rank(), final_loss

    results = hvdtrun.run(train, args=(10,), num_proc=4, hosts="node1:2,node2:2")

It takes horovod.run's arguments, and they mean what hvdtrun's flags of the same names mean:
each becomes its flag, so hvdtrun refuses with the same reasons what it refuses (use_gloo,
ssh_port, ...), raised here as ValueError. `executable` is the Python the ranks run the function
with (default this one's). With `host_discovery_script` the
job is elastic: the results are those of its last start, the one that finished.

The function and its arguments travel pickled by cloudpickle (so a function of a notebook or a
closure travels too) to each rank over a connection of its own to this process, and the rank's
result or error comes back the same way. Each connection is authenticated with a key of this
call (multiprocessing's HMAC handshake), which the ranks get in their environment. A rank whose
function raises fails the call with RankFailed, naming the rank and carrying its traceback,
raised from the rank's own exception where that unpickles here. The rank itself then exits with
hvdtrain's status for the error (3 for a bug, 75 for a lost peer: hvdtrain/core/exits.py).

On each rank, `python -m hvdtrain.launch.hvdtrun.function_job ADDRESS[,ADDRESS...] PORT` fetches
the call and runs it (after hvdtrun's rank_start.py, like any command of hvdtrun's).
"""

import os
import secrets
import signal
import sys
import threading
import traceback
import warnings
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from typing import Any, Callable, Dict, List, Optional, Sequence

import cloudpickle

from hvdtrain.launch.hvdtrun import command, elastic, rank_watch
from hvdtrain.launch.relay import RankFailed

KEY_VARIABLE = "HVDTRAIN_FUNCTION_KEY"  # forwarded by mpirun, as every HVDTRAIN_ variable is


def run(func: Callable[..., Any], args: Sequence = (), kwargs: Optional[Dict] = None, num_proc: int = 1,
        min_num_proc: Optional[int] = None, max_num_proc: Optional[int] = None, slots: Optional[int] = None,
        reset_limit: Optional[int] = None, cooldown_range: Optional[Sequence[int]] = None,
        hosts: Optional[str] = None, hostfile: Optional[str] = None, host_discovery_script: Optional[str] = None,
        start_timeout: Optional[int] = None, ssh_port: Optional[int] = None, ssh_identity_file: Optional[str] = None,
        disable_cache: Optional[bool] = None, output_filename: Optional[str] = None, verbose: Optional[bool] = None,
        use_gloo: Optional[bool] = None, use_mpi: Optional[bool] = None, mpi_args: Optional[str] = None,
        network_interface: Optional[str] = None, network_interfaces: Optional[Sequence[str]] = None,
        executable: Optional[str] = None, np: Optional[int] = None, min_np: Optional[int] = None,
        max_np: Optional[int] = None) -> List[Any]:
    """`func(*args, **kwargs)` on every rank; what each returned, in rank order (see the module)."""
    num_proc, min_num_proc, max_num_proc, network_interfaces = _horovods_deprecated_names(
        num_proc, min_num_proc, max_num_proc, network_interfaces, np, min_np, max_np, network_interface)
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")  # Horovod's words
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("hvdtrun.run: call it from the main thread, where it can stop the job on Ctrl-C and at "
                         "its start timeout")
    try:
        call = cloudpickle.dumps((func, tuple(args), dict(kwargs or {})))
    except Exception as error:
        raise ValueError(f"hvdtrun.run: the function or its arguments cannot be pickled: {error}") from None
    flags = _flags(num_proc=num_proc, min_num_proc=min_num_proc, max_num_proc=max_num_proc, slots=slots,
                   reset_limit=reset_limit, cooldown_range=cooldown_range, hosts=hosts, hostfile=hostfile,
                   host_discovery_script=host_discovery_script, start_timeout=start_timeout, ssh_port=ssh_port,
                   ssh_identity_file=ssh_identity_file, disable_cache=disable_cache,
                   output_filename=output_filename, verbose=verbose, use_gloo=use_gloo, use_mpi=use_mpi,
                   mpi_args=mpi_args, network_interfaces=network_interfaces)
    key, python = secrets.token_bytes(32), executable or sys.executable
    try:
        # the ranks' command is set once the call server listens
        options = command.parse_command_line([*flags, python])
        hosts = None if options.host_discovery_script else command.job_hosts(options)
        with _CallServer(call, key, rank_watch.listening_address(hosts, options.network_interfaces)) as server:
            options.command = [python, "-m", "hvdtrain.launch.hvdtrun.function_job", ",".join(server.addresses),
                               str(server.port)]
            with _ranks_environment({KEY_VARIABLE: key.hex()}), _signals_restored():
                status = command.run_job(options, copy_to=_copy_to())
            return server.results(status)
    except (command.UsageError, ValueError) as error:  # refused before any rank started
        raise ValueError(f"hvdtrun.run: {error}") from None


def _horovods_deprecated_names(num_proc, min_num_proc, max_num_proc, network_interfaces, np, min_np, max_np,
                               network_interface):
    """horovod.run's older argument names, taken with its warnings."""
    if network_interface:
        network_interfaces = network_interface.split(",")
        warnings.warn("network_interface is deprecated, use network_interfaces instead", DeprecationWarning,
                      stacklevel=3)
    if np is not None:
        num_proc = np
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning, stacklevel=3)
    min_num_proc, max_num_proc = elastic.horovods_process_counts(min_num_proc, max_num_proc, min_np, max_np,
                                                                 stacklevel=4)
    return num_proc, min_num_proc, max_num_proc, network_interfaces


def _flags(**given):
    """hvdtrun's flags for horovod.run's arguments (those given: not None, not False)."""
    names = {"num_proc": "-np", "min_num_proc": "--min-np", "max_num_proc": "--max-np",
             "slots": "--slots-per-host", "reset_limit": "--reset-limit", "hosts": "-H", "hostfile": "--hostfile",
             "host_discovery_script": "--host-discovery-script", "start_timeout": "--start-timeout",
             "ssh_port": "--ssh-port", "ssh_identity_file": "--ssh-identity-file", "output_filename":
             "--output-filename", "mpi_args": "--mpi-args"}
    switches = {"disable_cache": "--disable-cache", "verbose": "--verbose", "use_gloo": "--gloo", "use_mpi": "--mpi"}
    flags = []
    for name, value in given.items():
        if value is None or value is False:
            continue
        if name in switches:
            flags.append(switches[name])
        elif name == "cooldown_range":
            flags += ["--blacklist-cooldown-range", *map(str, value)]
        elif name == "network_interfaces":
            flags += ["--network-interfaces", ",".join(value)]
        else:
            flags += [names[name], str(value)]
    return flags


class _ranks_environment:
    """`variables` in this process's environment while the job runs (mpirun forwards them to the
    ranks from there, as it does those the elastic driver sets), and the environment as it was
    after."""

    def __init__(self, variables):
        self.variables, self.before = variables, {}

    def __enter__(self):
        self.before = dict(os.environ)
        os.environ.update(self.variables)

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.before)


class _signals_restored:
    """hvdtrun's launch takes SIGINT and SIGTERM to stop the job; the caller gets its own handlers
    back after."""

    def __enter__(self):
        self.handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc):
        for signum, handler in self.handlers.items():
            signal.signal(signum, handler)


def _copy_to():
    """The ranks' output goes to this process's descriptors 1 and 2 where sys.stdout and
    sys.stderr are those; else (a notebook) it is copied into sys.stdout and sys.stderr."""
    def on_descriptor(stream, descriptor):
        try:
            return stream.fileno() == descriptor
        except (AttributeError, OSError, ValueError):
            return False

    return None if on_descriptor(sys.stdout, 1) and on_descriptor(sys.stderr, 2) else (sys.stdout, sys.stderr)


class _CallServer:
    """Sends the pickled call to every rank that connects and keeps what each sends back, by the
    mpirun job it ran in (an elastic job starts several)."""

    def __init__(self, call: bytes, key: bytes, where):
        host, self.addresses = where
        self.call = call
        self.listener = Listener((host, 0), family="AF_INET", authkey=key, backlog=128)
        self.port = self.listener.address[1]
        self.lock = threading.Lock()
        # mpirun job (its PMIx namespace) -> rank -> ("ok", result, address) | ("error", error, text, address)
        self.outcomes: Dict[str, Dict[int, tuple]] = {}
        self.completed: List[str] = []  # jobs every rank of which returned, in the order they did
        threading.Thread(target=self._accept, name="hvdtrun-run-calls", daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                connection = self.listener.accept()
            except (AuthenticationError, EOFError, ConnectionError):
                continue  # not one of this call's ranks
            except OSError:
                return  # the listener was closed
            address = self.listener.last_accepted[0]
            threading.Thread(target=self._serve, args=(connection, address), daemon=True).start()

    def _serve(self, connection, address):
        with connection:
            try:
                job, rank, size = connection.recv()
                connection.send_bytes(self.call)
                outcome = cloudpickle.loads(connection.recv_bytes())
            except (EOFError, OSError):
                return  # the rank ended without an outcome: the job's status says why
            except Exception as error:  # its result does not unpickle here
                outcome = ("error", None, f"its result cannot be unpickled here: {error!r}")
            with self.lock:
                self.outcomes.setdefault(job, {})[rank] = (*outcome, address)
                if len(self.outcomes[job]) == size and all(o[0] == "ok" for o in self.outcomes[job].values()):
                    self.completed.append(job)

    def results(self, status):
        """The results of the job's last start, in rank order, where it ended with status 0;
        RankFailed for the first rank that raised, else KeyboardInterrupt after Ctrl-C, else
        RuntimeError with the status."""
        with self.lock:
            if status == 0 and self.completed:
                outcomes = self.outcomes[self.completed[-1]]
                return [outcomes[rank][1] for rank in range(len(outcomes))]
            errors = sorted((rank, outcome) for outcomes in self.outcomes.values()
                            for rank, outcome in outcomes.items() if outcome[0] == "error")
        if errors:
            rank, (_, error, text, address) = errors[0]
            raise RankFailed(f"rank {rank} ({address}) failed: {text}") from error
        if status == 130:
            raise KeyboardInterrupt
        if status == 0:
            raise RuntimeError("hvdtrun.run: the job ended with status 0, but not every rank returned a result")
        raise RuntimeError(f"hvdtrun.run: the job failed with exit status {status}; its output says why")


def rank_main(argv: Sequence[str]) -> int:
    """A rank's side: fetch the call, run it, send back its result or error."""
    from hvdtrain.core.exits import EXIT_RANK_ERROR, exit_status

    addresses, port = argv[0].split(","), int(argv[1])
    key = bytes.fromhex(os.environ.pop(KEY_VARIABLE))  # the function's own processes need not see it
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    link = _connect(addresses, port, key)
    link.send((os.environ.get("PMIX_NAMESPACE", ""), rank, size))  # the namespace names this start of the job
    func, args, kwargs = cloudpickle.loads(link.recv_bytes())
    try:
        outcome, status = ("ok", func(*args, **kwargs)), 0
    except Exception as error:
        text = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
        outcome, status = ("error", error, text), exit_status(error)
    try:
        link.send_bytes(cloudpickle.dumps(outcome))
    except Exception as error:  # an error that does not pickle travels as its text; a result, as the failure
        if outcome[0] == "ok":
            text, status = f"its result cannot be pickled: {error!r}", EXIT_RANK_ERROR
        link.send_bytes(cloudpickle.dumps(("error", None, text)))
    link.close()
    return status


def _connect(addresses, port, key):
    errors = []
    for address in addresses:
        try:
            return Client((address, port), family="AF_INET", authkey=key)
        except OSError as error:
            errors.append(f"{address}: {error}")
    raise SystemExit(f"hvdtrun.run: rank {os.environ.get('OMPI_COMM_WORLD_RANK')} cannot reach the calling "
                     f"process ({'; '.join(errors)}); choose a reachable interface with network_interfaces")


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1:]))
