"""Process sets: collectives among a subset of the ranks, with Horovod 0.28's API.

Each process set other than the global one gets an engine of its own, on a communicator of its
members alone. Its collectives are negotiated among those members only, so sets make progress
independently of each other, and a rank outside a set never waits for it. Ranks are always the
job's ranks (as `rank()` numbers them), also for a broadcast's root; a set's own numbering
shows only in `ProcessSet.rank()` and in the order of gathered results.

Sets made from lists of ranks are registered by every rank in the same order: the ones given to
`init(process_sets=...)`, then, where dynamic process sets are enabled, those passed to
`add_process_set`. A set made from an MPI communicator is passed to `init` by its members only
(each rank knows only the communicators it belongs to, as in Horovod's example of even and odd
ranks); every rank registers it all the same, after the sets made from lists.
"""

import dataclasses
import operator
import sys


class ProcessSet:
    """Ranks that run collectives together. Pass it to `init(process_sets=[...])` or
    `add_process_set()`; `process_set_id` is set once it is registered."""

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self.mpi_comm = None
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            if not _is_mpi_communicator(ranks_or_comm):
                raise ValueError(
                    "a ProcessSet is made from a list of ranks or an mpi4py communicator, got "
                    f"{type(ranks_or_comm).__name__}"
                ) from None
            self.mpi_comm = ranks_or_comm
            self.ranks = None  # the job's ranks of its processes, known once registered
            return
        try:
            ranks = sorted(operator.index(r) for r in ranks)
        except TypeError:
            raise ValueError(f"ProcessSet ranks must be integers, got {ranks}") from None
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet ranks must be distinct, got {ranks}")
        self.ranks = ranks

    def size(self):
        """The number of ranks in the set; None before it is registered."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self):
        """This rank's position in the set (where its part lands in an allgather); None
        before the set is registered. Collectives still name ranks as `rank()` does."""
        if self.process_set_id is None:
            return None
        return self.ranks.index(_job_rank()) if self.included() else None

    def included(self):
        """Whether this rank belongs to the set; None before it is registered."""
        if self.process_set_id is None:
            return None
        return _job_rank() in self.ranks

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _is_mpi_communicator(value):
    # Whoever holds a communicator has imported mpi4py.MPI; importing it here for the check
    # would start MPI in a process that only made a set from a list.
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(value, mpi.Comm)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


@dataclasses.dataclass
class _Registry:
    comm: object  # the communicator init() was given, split for each new set
    settings: object
    world_engine: object
    dynamic: bool
    engines: dict = dataclasses.field(default_factory=dict)  # id -> this rank's engine of the set, or None
    sets: dict = dataclasses.field(default_factory=dict)  # id -> the registered ProcessSet
    next_id: int = 1


_registry = None


def _job_rank():
    return _running_registry().world_engine.rank


def agree_at_init(comm, process_sets):
    """Called by init() on every rank before any engine starts: the sets to register, agreed
    with plain MPI on `comm`, so that registering leaves no trace in the engine (its cache, the
    timeline). Every rank takes part, even with no sets of its own: a rank outside every
    communicator still registers the sets other ranks made from theirs."""
    requests = [_request(s, comm) for s in process_sets]
    return requests, _agree(comm.allgather(requests), 1, comm.Get_size(), at_init=True)


def start(comm, settings, world_engine, process_sets, agreement, dynamic):
    """Called by init() once the global engine runs: register the sets of `agree_at_init`."""
    global _registry
    _registry = _Registry(comm, settings, world_engine, dynamic)
    global_process_set.ranks = list(range(world_engine.size))
    _register(process_sets, *agreement)


def stop():
    """Called by shutdown(): stop every set's engine and forget the sets."""
    global _registry
    registry, _registry = _registry, None
    if registry is None:
        return
    for process_set in registry.sets.values():
        process_set.process_set_id = None
    for engine in registry.engines.values():
        if engine is not None:
            engine.shutdown()


def add_process_set(process_set):
    """Register a new set (a ProcessSet or a list of ranks) on every rank and return it.
    Needs dynamic process sets (HOROVOD_DYNAMIC_PROCESS_SETS=1 or init(process_sets="dynamic"))."""
    registry = _running_registry()
    if not registry.dynamic:
        raise ValueError(
            "add_process_set() needs dynamic process sets: set HOROVOD_DYNAMIC_PROCESS_SETS=1 or call "
            "init(process_sets='dynamic'); or pass the sets to init(process_sets=[...])"
        )
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    from . import allgather_object

    requests = [_request(process_set, registry.comm, dynamic=True)]
    # Through the global engine, which owns the communicators while it runs.
    asked = allgather_object(requests, name=f"process_set.{registry.next_id}")
    _register([process_set], requests, _agree(asked, registry.next_id, registry.world_engine.size))
    return process_set


def remove_process_set(process_set):
    """Unregister a set on every rank. False for the global set or one not registered."""
    registry = _running_registry()
    if not registry.dynamic:
        raise ValueError(
            "remove_process_set() needs dynamic process sets: set HOROVOD_DYNAMIC_PROCESS_SETS=1 or call "
            "init(process_sets='dynamic')"
        )
    set_id = process_set.process_set_id
    registered = registry.sets.get(set_id)
    if not set_id or registered is None or registered.ranks != process_set.ranks:
        return False
    del registry.sets[set_id]
    engine = registry.engines.pop(set_id)
    registered.process_set_id = process_set.process_set_id = None
    if engine is not None:
        engine.shutdown()  # its members stop it together: each of them removes the set
    return True


def engine_of(process_set):
    """The engine that runs this rank's collectives in `process_set`."""
    registry = _running_registry()
    set_id = process_set.process_set_id
    if set_id == 0:
        return registry.world_engine
    registered = registry.sets.get(set_id)
    if registered is None or registered.ranks != process_set.ranks:
        raise ValueError(f"{process_set} is not registered: pass it to init(process_sets=[...]) or add_process_set()")
    engine = registry.engines[set_id]
    if engine is None:
        raise ValueError(
            f"rank {registry.world_engine.rank} is not a member of process set {process_set.process_set_id} "
            f"(ranks {process_set.ranks}) and cannot take part in its collectives"
        )
    return engine


def process_set_by_id(process_set_id):
    """The registered process set of that id (0: the global set)."""
    registry = _running_registry()
    if process_set_id == 0:
        return global_process_set
    if process_set_id not in registry.sets:
        raise ValueError(f"no process set with id {process_set_id} is registered")
    return registry.sets[process_set_id]


def _running_registry():
    if _registry is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _registry


def _register(process_sets, requests, agreed):
    """Register the `agreed` sets (lists of ranks, in id order) on this rank; `process_sets`
    are this rank's objects, `requests` what it asked for them."""
    from mpi4py import MPI

    registry = _running_registry()
    world = registry.world_engine
    first_id = registry.next_id
    for ranks in agreed:
        duplicate = next((s for s in registry.sets.values() if s.ranks == ranks), None)
        if duplicate is not None:
            raise ValueError(f"a process set with ranks {ranks} is already registered: {duplicate}")
    if agreed and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise ValueError(
            "process sets run an engine thread each and need MPI_THREAD_MULTIPLE; MPI was initialized "
            f"with thread level {MPI.Query_thread()}"
        )
    # This rank's objects take the ids of their sets; the sets it did not pass (communicators it
    # is not part of) get objects of their own, so that process_set_by_id knows every set.
    objects = {}
    for process_set, (_, ranks) in zip(process_sets, requests):
        objects.setdefault(tuple(ranks), process_set)
    for set_id, ranks in enumerate(agreed, start=first_id):
        process_set = objects.get(tuple(ranks)) or ProcessSet(ranks)
        member = world.rank in ranks
        comm = registry.comm.Split(color=0 if member else MPI.UNDEFINED, key=world.rank)
        engine = None
        if member:
            from .engine import Engine

            # One timeline per job, written by the global engine: a set's rank 0 would overwrite it.
            settings = dataclasses.replace(registry.settings, timeline_path=None)
            engine = Engine(comm, settings, members=tuple(ranks), core=world.core)
        registry.next_id = set_id + 1
        registry.engines[set_id] = engine
        registry.sets[set_id] = process_set
        process_set.ranks, process_set.process_set_id = list(ranks), set_id
    ids = {tuple(s.ranks): set_id for set_id, s in registry.sets.items()}
    ids[tuple(range(world.size))] = 0
    for process_set, (_, ranks) in zip(process_sets, requests):  # sets of all ranks among them: the global set
        process_set.ranks, process_set.process_set_id = list(ranks), ids[tuple(ranks)]


def _request(process_set, init_comm, dynamic=False):
    """What this rank asks to register: ("ranks", ranks), ("comm", the job's ranks of the
    communicator's processes), or ("error", why this rank cannot)."""
    if process_set.process_set_id is not None:
        return "error", f"{process_set} is already registered"
    if process_set.mpi_comm is None:
        return "ranks", process_set.ranks
    if dynamic:
        return "error", ("add_process_set() takes lists of ranks; pass process sets made from MPI communicators "
                         "to init(process_sets=[...])")
    from mpi4py import MPI

    comm = process_set.mpi_comm
    if comm == MPI.COMM_NULL:
        return "error", "its ProcessSet was made from MPI.COMM_NULL (a communicator this rank is not part of)"
    if comm.Is_inter():
        return "error", "its ProcessSet was made from an intercommunicator"
    ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())), init_comm.Get_group())
    if MPI.UNDEFINED in ranks:
        return "error", "its ProcessSet was made from a communicator with processes outside init()'s communicator"
    return "comm", sorted(ranks)


def _agree(asked, first_id, size, at_init=False):
    """The sets to register, in id order, from what each rank asked for (`asked[rank]`), or a
    ValueError naming the ranks at fault: the same on every rank, since all see `asked`.
    `at_init`: as in Horovod, a set of all ranks (in any order, or a communicator of all) is the
    global set, not registered again. A set given twice is refused, naming both entries."""
    errors = [f"rank {r}: {detail}" for r, requests in enumerate(asked) for kind, detail in requests
              if kind == "error"]
    if errors:
        raise ValueError(f"cannot register process sets ({'; '.join(errors)})")
    everyone = list(range(size))
    for r, requests in enumerate(asked):
        asked_ranks = [ranks for _, ranks in requests]
        for later, ranks in enumerate(asked_ranks):
            if ranks in asked_ranks[:later] and not (at_init and ranks == everyone):
                raise ValueError(f"rank {r} passed the process set of ranks {ranks} twice (entries "
                                 f"{asked_ranks.index(ranks)} and {later})")
    if at_init:
        asked = [[(kind, ranks) for kind, ranks in requests if ranks != everyone] for requests in asked]
    from_lists = [[ranks for kind, ranks in requests if kind == "ranks"] for requests in asked]
    for position in range(max(map(len, from_lists))):
        by_rank = [lists[position] if position < len(lists) else None for lists in from_lists]
        if any(ranks != by_rank[0] for ranks in by_rank):
            listed = "; ".join(f"rank {r}: {'nothing' if ranks is None else ranks}" for r, ranks in enumerate(by_rank))
            raise ValueError(
                f"ranks registered different process sets as set {first_id + position} ({listed}); every rank "
                "must register the same sets in the same order"
            )
    agreed = list(from_lists[0])
    for ranks in agreed:
        outside = [r for r in ranks if not 0 <= r < size]
        if not ranks or outside:
            raise ValueError(f"process set ranks {ranks} must be a non-empty list of ranks of this job (0 to {size - 1})")
    from_comms = [[ranks for kind, ranks in requests if kind == "comm"] for requests in asked]
    for ranks in (ranks for comms in from_comms for ranks in comms):
        if ranks in agreed:
            continue
        missing = [m for m in ranks if ranks not in from_comms[m]]
        if missing:
            passed = [r for r, comms in enumerate(from_comms) if ranks in comms]
            raise ValueError(
                f"the process set of ranks {ranks}, made from an MPI communicator, was passed to init() by "
                f"rank(s) {passed} but not by its member(s) {missing}; every member must pass it"
            )
        agreed.append(ranks)
    return agreed
