"""Horovod Elastic's API (`hvd.elastic.run`, the states, `commit`, `check_host_updates`), kept
by restarts.

Horovod changes a running job's members in place; an MPI job's members are fixed for its life.
So under `hvdtrun --host-discovery-script ...` (hvdtrain/launch/hvdtrun/elastic.py), or
hvdtrain.ray's elastic RayExecutor and hvdtrain.spark.run_elastic, which drive their jobs with the
same loop, a change of hosts, or a failed rank, ends the job, and hvdtrun starts it again on the
hosts there are, where the script goes on from its last commit without noticing:
- `state.commit()` keeps the state in memory as Horovod's does, and rank 0 also sends it to
  hvdtrun's commit store (a socket of hvdtrun's; the address comes in HVDTRAIN_ELASTIC_STORE), so that it
  outlives the job and needs no shared file system;
- `run(func)` on a restarted job: rank 0 fetches the last commit, every rank takes it by the
  state's `sync()` (a broadcast from rank 0), the reset callbacks run (the world may have another
  size), and `func(state)` goes on from there;
- `state.check_host_updates()` (in every commit): rank 0 asks the store whether hvdtrun has seen
  the hosts change since this job started, every rank learns the answer by broadcast, and all
  raise HostsUpdatedInterrupt together; `run` then ends the job with EXIT_HOSTS_UPDATED, which
  tells hvdtrun to start it on the new hosts;
- a HorovodInternalError (a peer gone) ends the job with EXIT_COMMUNICATION, and hvdtrun starts
  it again from the last commit; any other error of the script's (in `func`, a reset callback)
  ends it with EXIT_RANK_ERROR, which hvdtrun does not start again: from the last commit it would
  meet the same error, over and over.
Outside hvdtrun's elastic mode there is no store: commits stay in memory, hosts never change, and
an error ends the script as it would without `run`.
"""

import copy
import os
import pickle
import socket
import sys
import traceback

from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .exits import EXIT_COMMUNICATION, EXIT_HOSTS_UPDATED, exit_status

STORE_VARIABLE = "HVDTRAIN_ELASTIC_STORE"  # ADDRESS[,ADDRESS...]:PORT of hvdtrun's commit store
HOSTS_VERSION_VARIABLE = "HVDTRAIN_ELASTIC_HOSTS_VERSION"  # the hosts' version this job started with
CONNECT_TIMEOUT_S = 30.0


class CommitStore:
    """The client of hvdtrun's commit store: `put(bytes)`, `get()` -> bytes or None, and
    `hosts_version()`. One request per connection: a line, then the bytes it announces."""

    def __init__(self, address):
        addresses, port = address.rsplit(":", 1)
        self.addresses, self.port = addresses.split(","), int(port)

    def _request(self, line, payload=b""):
        errors = []
        for address in self.addresses:
            try:
                connection = socket.create_connection((address, self.port), timeout=CONNECT_TIMEOUT_S)
            except OSError as error:
                errors.append(f"{address}: {error}")
                continue
            with connection, connection.makefile("rb") as reply:
                connection.sendall(line.encode() + b"\n" + payload)
                header = reply.readline().decode().split()
                return header, reply.read(int(header[1])) if header[0] == "DATA" else b""
        raise HorovodInternalError(f"hvdtrun's commit store cannot be reached ({'; '.join(errors)})")

    def put(self, data):
        self._request(f"PUT {len(data)}", data)

    def get(self):
        header, data = self._request("GET")
        return data if header[0] == "DATA" else None

    def hosts_version(self):
        return int(self._request("VERSION")[0][1])

    def returned(self):
        """Tell hvdtrun that `run`'s function returned: the job's end is the script's, not a lost
        host's (mpirun may end with status 0 when a host is lost)."""
        self._request("RETURNED")

    def failed(self, status):
        """Tell hvdtrun that this rank ends with `status`, for an error a restart would meet
        again. mpirun's own status may be another's: a peer that MPI itself aborted on losing
        this rank can be counted first, and a restart would then meet the error again."""
        self._request(f"FAILED {status}")


def commit_store():
    address = os.environ.get(STORE_VARIABLE)
    return CommitStore(address) if address else None


class State:
    """What `run` keeps across failures and changes of hosts. Subclasses say how to save,
    restore and sync their objects, and how to turn the saved state into bytes and back."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object, self._rank = bcast_object, get_rank
        self._reset_callbacks = []
        self._hosts_version = int(os.environ.get(HOSTS_VERSION_VARIABLE, "0"))

    def register_reset_callbacks(self, callbacks):
        """Functions to call after a reset (the job started again, maybe with another size), e.g.
        to scale the learning rate with the new number of workers."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Keep the state as it is now: in memory, and where hvdtrun runs the job elastically, in
        hvdtrun's store, which a restarted job goes on from. Then check for new hosts."""
        self.save()
        store = commit_store()
        if store is not None and self._rank() == 0:
            store.put(self.saved_bytes())
        self.check_host_updates()

    def check_host_updates(self):
        """Raise HostsUpdatedInterrupt on every rank where hvdtrun has seen the hosts change since
        this job started (rank 0 asks, every rank learns its answer)."""
        store = commit_store()
        if store is None:
            return
        version = store.hosts_version() if self._rank() == 0 else None
        version = self._bcast_object(version)
        if version > self._hosts_version:
            raise HostsUpdatedInterrupt(False)

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def reset(self):
        """Reset objects after a reset event, before the state is synced."""

    def saved_bytes(self):
        raise NotImplementedError

    def load_saved_bytes(self, data):
        """Make `data` (from saved_bytes) the saved state, and restore it."""
        raise NotImplementedError


class ObjectState(State):
    """Plain Python objects, given as keyword arguments and kept as attributes."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object, get_rank)

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def saved_bytes(self):
        return state_bytes(pickle.dumps, self._saved_state, self._saved_state)

    def load_saved_bytes(self, data):
        self._saved_state = pickle.loads(data)
        self.restore()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


def state_bytes(dumps, saved, attributes):
    """dumps(saved): a state's saved attributes (`attributes`, by name) as bytes for the commit
    store. Where they cannot be, a TypeError naming the attribute at fault: Horovod keeps commits
    in memory, so a script written for it may hold objects that do not pickle."""
    try:
        return dumps(saved)
    except Exception as error:
        for name, value in attributes.items():
            try:
                dumps(value)
            except Exception:
                raise TypeError(f"hvd.elastic: the state's {name!r} ({type(value).__name__}) cannot be kept across "
                                f"a restart: {error}") from error
        raise


def run_fn(func, bcast_object, get_rank):
    """Horovod's `hvd.elastic.run` for one framework (its object broadcast and rank)."""

    def wrapper(state, *args, **kwargs):
        store = commit_store()
        try:
            committed = store.get() if store is not None and get_rank() == 0 else None
            resumed = bcast_object(committed is not None)
            if committed is not None:
                state.load_saved_bytes(committed)
            if resumed:
                state.on_reset()
            state.sync()
            result = func(state, *args, **kwargs)
            if store is not None and get_rank() == 0:
                store.returned()
            return result
        except HostsUpdatedInterrupt:
            if store is None:
                raise
            _leave(EXIT_HOSTS_UPDATED)
        except Exception as error:
            if store is None:
                raise
            status = exit_status(error)
            if status == EXIT_COMMUNICATION:
                print(f"hvdtrain: rank {get_rank()} lost its peers ({error}); the job starts again from the last "
                      f"commit", file=sys.stderr, flush=True)
            else:
                # The script's own error, which a restart from the last commit would meet again
                # (Horovod would blacklist the host and end a job that every host failed)
                traceback.print_exc()
                print(f"hvdtrain: rank {get_rank()} raised {type(error).__name__}: {error}; a restart would meet it "
                      f"again, so the job is not started again", file=sys.stderr, flush=True)
                try:
                    store.failed(status)
                except HorovodInternalError:
                    pass  # the store is gone: mpirun's status is all the driver has
            _leave(status)

    wrapper.__wrapped__ = func
    wrapper.__name__ = getattr(func, "__name__", "elastic_run")
    wrapper.__doc__ = func.__doc__
    return wrapper


def _leave(status):
    """End this rank at once, past atexit: its peers leave alike, or are gone."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def framework_api(bcast_object, get_rank):
    """`run` and `ObjectState` of one framework's `hvd.elastic`, on its object broadcast and rank."""

    def run(func):
        """Run `func(state, ...)` so that it survives failures and changes of hosts: after a
        restart it starts from the last commit, with every rank's state synced from rank 0."""
        return run_fn(func, bcast_object, get_rank)

    class FrameworkObjectState(ObjectState):
        __doc__ = ObjectState.__doc__

        def __init__(self, **kwargs):
            super().__init__(bcast_object, get_rank, **kwargs)

    FrameworkObjectState.__name__ = FrameworkObjectState.__qualname__ = "ObjectState"
    return run, FrameworkObjectState
