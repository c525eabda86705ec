"""The Horovod variables hvdtrain ignores (hvdtrain/core/settings.py) are named once in a job, by
rank 0, however often the engine starts. Their messages are in tests/single/core/test_settings.py."""

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
