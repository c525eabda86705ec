"""Collectives in a TF1 graph run by a tf.compat.v1.Session, holding none of its threads while they wait.

A session runs a step's independent ops in any order on a small pool of threads (a single one
with inter_op_parallelism_threads=1). A collective op that kept its thread until the peers
arrive would deadlock ranks that started different collectives first, and unlike in a
tf.function no fixed order can be imposed: one run may fetch any subset of a graph's
collectives. Horovod's kernels are asynchronous for this reason; TensorFlow runs no Python
asynchronously, so each collective here is three ops:

- `start`, a numpy_function, hands the inputs to the core and returns at once with a ticket;
- a wait on a FIFO queue of the collective's own for that ticket: TensorFlow's dequeue is an
  asynchronous kernel, so a waiting collective holds no thread;
- `finish`, a numpy_function, returns the results (or raises the collective's error).

A thread of ours waits for the core's handles in the order the collectives started, and as each
one finishes enqueues its ticket by running the queue's enqueue op in every open session of the
graph (a queue is a resource of each session). The wait dequeues until it sees its own ticket,
dropping those of collectives whose step was cut short by an error elsewhere and those meant for
another session of the same graph.

Sessions are found by recording each one made (tf.compat.v1.Session's constructor is wrapped
when this module is imported): TensorFlow gives an op no way to reach the session running it.

TensorFlow turns any error a Python op raises into UnknownError, whatever its type. So that a
disagreement between ranks reaches `Session.run` (and MonitoredTrainingSession) as the
FailedPreconditionError Horovod's kernels raise, `finish` keeps the error it raised on its
collective's channel, and `Session.run`, wrapped as the constructor is, raises that error's type
in place of the UnknownError of a `finish` op.
"""

import atexit
import itertools
import queue
import threading
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.client.session import BaseSession

# How long the exit waits for the thread below to hand over what it has in hand (normally nothing).
EXIT_WAIT_S = 10.0

# graph -> its sessions, recorded as they are made.
_sessions_of = weakref.WeakKeyDictionary()
_sessions_lock = threading.Lock()


def _record_sessions(init):
    def recording_init(session, *args, **kwargs):
        init(session, *args, **kwargs)
        with _sessions_lock:
            _sessions_of.setdefault(session.graph, weakref.WeakSet()).add(session)

    return recording_init


def _raising_collectives_errors(run):
    def running(session, *args, **kwargs):
        try:
            return run(session, *args, **kwargs)
        except tf.errors.UnknownError as error:
            reference = _channel_finishing.get(session.graph, {}).get(getattr(error.op, "name", None))
            channel = reference() if reference is not None else None
            raised = channel.take_raised() if channel is not None else None
            if raised is None:
                raise
            raise type(raised)(error.node_def, error.op, raised.message) from error

    return running


if not getattr(BaseSession.__init__, "_hvdtrain_records_sessions", False):
    BaseSession.__init__ = _record_sessions(BaseSession.__init__)
    BaseSession.__init__._hvdtrain_records_sessions = True
    BaseSession.run = _raising_collectives_errors(BaseSession.run)


def in_session_graph():
    """Whether ops built now run in a graph that a session runs (TF1), rather than eagerly or
    in a tf.function."""
    return not tf.compat.v1.executing_eagerly_outside_functions()


def run_on_core(start, tensors, dtypes, kind):
    """The results (tensors of `dtypes`) of `start(arrays)`, which hands the tensors' arrays to
    the core and returns a function that waits for the collective and gives its result arrays."""
    with tf.init_scope():  # in the session's graph, also from a branch of a tf.cond in it
        graph = tf.compat.v1.get_default_graph()
        with graph.name_scope(None):
            signals = tf.queue.FIFOQueue(-1, [tf.int64], shapes=[[]], name=f"Horovod{kind}Signals")
            signalled = tf.compat.v1.placeholder(tf.int64, [], name=f"Horovod{kind}Signal")
            channel = _Channel(graph, signals.enqueue([signalled]), signalled)

    def started(*arrays):
        return np.int64(_deliveries.start(channel, start, [np.asarray(a) for a in arrays]))

    ticket = tf.numpy_function(started, list(tensors), tf.int64, stateful=True, name=f"Horovod{kind}Start")
    seen = tf.compat.v1.while_loop(lambda last: tf.not_equal(last, ticket), lambda last: signals.dequeue(),
                                   [tf.constant(-1, tf.int64)], back_prop=False, name=f"Horovod{kind}Wait")
    results = tf.numpy_function(_deliveries.finish, [seen], list(dtypes) or [tf.int64], stateful=True,
                                name=f"Horovod{kind}")
    _channel_finishing.setdefault(graph, {})[results[0].op.name] = weakref.ref(channel)
    return results if dtypes else [results[0].op]


# graph -> {the name of a collective's `finish` op: a weak reference to the collective's _Channel}.
# The graph keeps its ops' Python functions, and with them their channels, alive; a strong
# reference here would keep the graph alive through the channel's ops.
_channel_finishing = weakref.WeakKeyDictionary()


class _Channel:
    """Where one collective op's tickets are signalled (its queue's enqueue op in each session),
    and the TensorFlow error its `finish` op raised last, until Session.run takes it."""

    def __init__(self, graph, signal, signalled):
        self._graph = weakref.ref(graph)
        self._signal = signal
        self._signalled = signalled
        self._raised = None

    def keep_raised(self, error):
        self._raised = error if isinstance(error, tf.errors.OpError) else None

    def take_raised(self):
        raised, self._raised = self._raised, None
        return raised

    def signal(self, ticket):
        graph = self._graph()
        with _sessions_lock:
            sessions = list(_sessions_of.get(graph, ())) if graph is not None else []
        for session in sessions:
            if session._closed:
                continue
            try:
                session.run(self._signal, {self._signalled: ticket})
            except (RuntimeError, tf.errors.CancelledError):
                pass  # closed meanwhile: nothing waits in it any more


class _Deliveries:
    """Tickets, the collectives behind them, and the thread that signals each one finished."""

    def __init__(self):
        self._tickets = itertools.count()
        self._outcomes = {}  # ticket -> (channel, results, error), until `finish` takes them
        self._started = queue.SimpleQueue()  # (ticket, channel, wait), or None: stop
        self._thread = None
        self._lock = threading.Lock()
        # The thread ends before the interpreter finalizes. A session it held the last reference
        # to is deleted on it, in TensorFlow's C++ without the GIL, and Python ends a daemon thread
        # that wants the GIL back once it is finalizing (pthread_exit), which TensorFlow's C++
        # turns into an abort of a process that had finished its work. Registered at import,
        # before hvd.init() registers the core's shutdown, this runs after it (exit handlers run
        # last registered first): by then every collective the thread waits for has ended.
        atexit.register(self._stop)

    def start(self, channel, start, arrays):
        wait = start(arrays)  # an error of the arguments is raised here, in the start op
        ticket = next(self._tickets)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver, name="hvdtrain-session-collectives",
                                                daemon=True)
                self._thread.start()
        self._started.put((ticket, channel, wait))
        return ticket

    def _stop(self):
        with self._lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
            self._started.put(None)
            thread.join(EXIT_WAIT_S)

    def _deliver(self):
        while True:
            started = self._started.get()
            if started is None:
                return
            self._deliver_one(*started)
            # nothing of the collective stays referenced here while the next is awaited: its
            # channel's ops would keep their graph alive
            del started

    def _deliver_one(self, ticket, channel, wait):
        try:
            outcome = (channel, wait(), None)
        except Exception as error:  # noqa: BLE001 (raised by `finish`, in the step that waits for it)
            outcome = (channel, None, error)
        with self._lock:
            self._outcomes[ticket] = outcome
        channel.signal(np.int64(ticket))

    def finish(self, ticket):
        ticket = int(ticket)
        with self._lock:
            channel, results, error = self._outcomes.pop(ticket)
            # Earlier tickets of the same op belong to steps cut short: nothing will take them.
            for stale in [t for t, outcome in self._outcomes.items() if t < ticket and outcome[0] is channel]:
                del self._outcomes[stale]
        if error is not None:
            channel.keep_raised(error)
            raise error
        return results if results else [np.int64(0)]


_deliveries = _Deliveries()
