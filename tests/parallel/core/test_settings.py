"""The Horovod variables hvdtrain ignores (hvdtrain/core/settings.py) are named once in a job, by
rank 0, however often the engine starts; HOROVOD_THREAD_AFFINITY binds each engine thread (the
job's and a process set's) to its local rank's core. The messages and the parsing:
tests/single/core/test_settings.py."""

from hvdtrain import core

IGNORED = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_FUSION_TRESHOLD": "1024"}


def the_engine_starts_twice():
    for _ in range(2):
        core.init()
        core.barrier()
        core.shutdown()


def test_ignored_variables_are_named_once_by_rank_0(ranks):
    reports = ranks.run(2, [the_engine_starts_twice], env=IGNORED)
    reports.assert_passed(the_engine_starts_twice)
    output = reports.output
    assert output.count("HOROVOD_AUTOTUNE is set but not implemented by hvdtrain; ignored") == 1, output
    assert output.count("(did you mean HOROVOD_FUSION_THRESHOLD?); ignored") == 1, output


def engine_threads_are_bound_to_their_local_ranks_cores():
    import os

    from hvdtrain.core import process_sets

    core.init(process_sets=[process_sets.ProcessSet([0]), process_sets.ProcessSet([1])])
    expected = {0: 1, 1: 0}[core.local_rank()]  # HOROVOD_THREAD_AFFINITY=1,0
    engines = [process_sets._running_registry().world_engine, *process_sets._running_registry().engines.values()]
    threads = [engine._thread.native_id for engine in engines if engine is not None]
    assert len(threads) == 2  # the job's engine and that of the process set of this rank
    assert [os.sched_getaffinity(thread) for thread in threads] == [{expected}, {expected}]
    assert os.sched_getaffinity(0) != {expected}  # the training thread is left as it was
    core.shutdown()


def test_horovod_thread_affinity_binds_each_engine_thread_to_its_local_ranks_core(ranks):
    reports = ranks.run(2, [engine_threads_are_bound_to_their_local_ranks_cores],
                        env={"HOROVOD_THREAD_AFFINITY": "1,0"})
    reports.assert_passed(engine_threads_are_bound_to_their_local_ranks_cores)
