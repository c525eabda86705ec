"""Process sets: collectives among a subset of the ranks, with Horovod 0.28's API.

Each process set other than the global one gets an engine of its own, on a communicator of its
members alone. Its collectives are negotiated among those members only, so sets make progress
independently of each other, and a rank outside a set never waits for it. Ranks are always the
job's ranks (as `rank()` numbers them), also for a broadcast's root; a set's own numbering
shows only in `ProcessSet.rank()` and in the order of gathered results.

Sets are registered by every rank in the same order: the ones given to `init(process_sets=...)`,
then, where dynamic process sets are enabled, those passed to `add_process_set`.
"""

import dataclasses
import operator


class ProcessSet:
    """Ranks that run collectives together. Pass it to `init(process_sets=[...])` or
    `add_process_set()`; `process_set_id` is set once it is registered."""

    def __init__(self, ranks):
        try:
            ranks = list(ranks)
        except TypeError:
            raise ValueError(
                f"a ProcessSet is made from a list of ranks, got {type(ranks).__name__} (hvdtrain does not "
                "build process sets from MPI communicators)"
            ) from None
        try:
            ranks = sorted(operator.index(r) for r in ranks)
        except TypeError:
            raise ValueError(f"ProcessSet ranks must be integers, got {ranks}") from None
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet ranks must be distinct, got {ranks}")
        self.ranks = ranks
        self.process_set_id = None

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


def start(comm, settings, world_engine, process_sets, dynamic):
    """Called by init() once the global engine runs: register `process_sets` in order."""
    global _registry
    _registry = _Registry(comm, settings, world_engine, dynamic)
    global_process_set.ranks = list(range(world_engine.size))
    for process_set in process_sets:
        _register(process_set)


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
    return _register(process_set)


def remove_process_set(process_set):
    """Unregister a set on every rank. False for the global set or one not registered."""
    registry = _running_registry()
    if not registry.dynamic:
        raise ValueError(
            "remove_process_set() needs dynamic process sets: set HOROVOD_DYNAMIC_PROCESS_SETS=1 or call "
            "init(process_sets='dynamic')"
        )
    set_id = process_set.process_set_id
    if not set_id or registry.sets.get(set_id) is not process_set:
        return False
    del registry.sets[set_id]
    engine = registry.engines.pop(set_id)
    process_set.process_set_id = None
    if engine is not None:
        engine.shutdown()  # its members stop it together: each of them removes the set
    return True


def engine_of(process_set):
    """The engine that runs this rank's collectives in `process_set`."""
    registry = _running_registry()
    set_id = process_set.process_set_id
    if registry.sets.get(set_id) is not process_set:
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


def _register(process_set):
    from mpi4py import MPI

    from . import allgather_object

    registry = _running_registry()
    world = registry.world_engine
    set_id = registry.next_id
    # Every rank must register the same sets in the same order. Agreeing first, before any
    # check that could fail on some ranks only, means that all of them fail together or none.
    asked = allgather_object(process_set.ranks, name=f"process_set.{set_id}")
    if any(ranks != asked[0] for ranks in asked):
        by_rank = "; ".join(f"rank {r}: {ranks}" for r, ranks in enumerate(asked))
        raise ValueError(
            f"ranks registered different process sets as set {set_id} ({by_rank}); every rank must "
            "register the same sets in the same order"
        )
    outside = [r for r in process_set.ranks if not 0 <= r < world.size]
    if not process_set.ranks or outside:
        raise ValueError(
            f"process set ranks {process_set.ranks} must be a non-empty list of ranks of this job "
            f"(0 to {world.size - 1})"
        )
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered")
    duplicate = next((s for s in registry.sets.values() if s.ranks == process_set.ranks), None)
    if duplicate is not None:
        raise ValueError(f"a process set with ranks {process_set.ranks} is already registered: {duplicate}")
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise ValueError(
            "process sets run an engine thread each and need MPI_THREAD_MULTIPLE; MPI was initialized "
            f"with thread level {MPI.Query_thread()}"
        )
    member = world.rank in process_set.ranks
    comm = registry.comm.Split(color=0 if member else MPI.UNDEFINED, key=world.rank)
    engine = None
    if member:
        from .engine import Engine

        # One timeline per job, written by the global engine: a set's rank 0 would overwrite it.
        settings = dataclasses.replace(registry.settings, timeline_path=None)
        engine = Engine(comm, settings, members=tuple(process_set.ranks))
    registry.next_id += 1
    registry.engines[set_id] = engine
    registry.sets[set_id] = process_set
    process_set.process_set_id = set_id
    return process_set
