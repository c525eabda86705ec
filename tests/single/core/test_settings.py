"""The engine's settings (hvdtrain/core/settings.py): Horovod's defaults, every HOROVOD_* variable
read as Horovod reads it (and the engine's log lines with the time unless HOROVOD_LOG_HIDE_TIME),
the GPU transports of HOROVOD_GPU_OPERATIONS and HOROVOD_GPU_<OP>, bad
values refused naming the variable (by init() too, before MPI is touched), and the Horovod
variables hvdtrain does not implement named with the nearest known one."""

import logging
import os
import re

import pytest

from hvdtrain import core
from hvdtrain.core.engine import engine_core
from hvdtrain.core.settings import MIB, Settings, from_environment, ignored_variables


def test_settings_default_to_horovods():
    assert from_environment({}) == Settings()
    assert Settings().fusion_threshold_bytes == 128 * MIB and Settings().cycle_time_s == 0.001
    assert (Settings().cache_capacity, Settings().stall_check_time_s, Settings().stall_shutdown_time_s) == (1024, 60, 0)
    assert Settings().log_level == logging.WARNING


def test_settings_read_the_environment():
    settings = from_environment({
        "HOROVOD_FUSION_THRESHOLD": "65536", "HOROVOD_CYCLE_TIME": "3.5", "HOROVOD_CACHE_CAPACITY": "0",
        "HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1", "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "7",
        "HOROVOD_LOG_LEVEL": "DEBUG", "HOROVOD_LOG_HIDE_TIME": "1", "HVDTRAIN_CHUNK_BYTES": "1024",
        "HOROVOD_THREAD_AFFINITY": "3,1",
    })
    assert settings == Settings(fusion_threshold_bytes=65536, cycle_time_s=0.0035, cache_capacity=0,
                                timeline_path="/tmp/t.json", timeline_mark_cycles=True, stall_check_enabled=False,
                                stall_check_time_s=5.0, stall_shutdown_time_s=7.0, log_level=logging.DEBUG,
                                log_hide_time=True, chunk_bytes=1024, thread_affinity=(3, 1))


@pytest.mark.parametrize("hidden", [False, True])
def test_the_engines_log_lines_begin_with_the_time_unless_horovod_log_hide_time(hidden):
    core._configure_logging(logging.WARNING, hide_time=hidden)
    [handler] = logging.getLogger("hvdtrain.core").handlers
    line = handler.format(logging.LogRecord("hvdtrain.core", logging.WARNING, __file__, 1, "a warning", (), None))
    if hidden:
        assert line == "[hvdtrain WARNING] a warning"
    else:
        assert re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} hvdtrain WARNING\] a warning", line), line


BAD_VALUES = [
    ("HOROVOD_FUSION_THRESHOLD", "abc"), ("HOROVOD_FUSION_THRESHOLD", "1.5"), ("HOROVOD_FUSION_THRESHOLD", "-1"),
    ("HOROVOD_LOG_LEVEL", "loud"), ("HOROVOD_CYCLE_TIME", "fast"), ("HOROVOD_CACHE_CAPACITY", "-5"),
    ("HOROVOD_STALL_CHECK_TIME_SECONDS", "soon"), ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "-2"),
    ("HVDTRAIN_CHUNK_BYTES", "0"), ("HOROVOD_THREAD_AFFINITY", "0,one"), ("HOROVOD_THREAD_AFFINITY", "-1"),
]


@pytest.mark.parametrize("variable, value", BAD_VALUES)
def test_bad_environment_value_names_the_variable(variable, value):
    with pytest.raises(ValueError, match=variable):
        from_environment({variable: value})


def test_init_refuses_a_bad_environment_value(monkeypatch):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "abc")
    with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD='abc'"):
        core.init()  # refused before MPI is touched
    assert not core.is_initialized()


def test_a_timeline_in_a_missing_folder_is_refused_naming_the_variable(tmp_path, monkeypatch):
    missing = tmp_path / "no such folder" / "timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(missing))
    with pytest.raises(ValueError, match=f"HOROVOD_TIMELINE='{missing}': folder {missing.parent} does not exist"):
        core.init()  # refused before MPI is touched
    assert not core.is_initialized()


# ----------------------------------------------------------------------------- GPU transports


def test_gpu_operations_default_to_nccl_and_follow_horovods_variables():
    assert from_environment({}).gpu_operations == dict.fromkeys(
        ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"], "NCCL")
    staged = from_environment({"HOROVOD_GPU_OPERATIONS": "mpi"}).gpu_operations
    assert set(staged.values()) == {"MPI"}
    mixed = from_environment({"HOROVOD_GPU_OPERATIONS": "MPI", "HOROVOD_GPU_ALLREDUCE": "NCCL",
                              "HOROVOD_GPU_ALLTOALL": "MPI"}).gpu_operations
    assert mixed == {"allreduce": "NCCL", "allgather": "MPI", "broadcast": "MPI", "alltoall": "MPI",
                     "reducescatter": "MPI"}
    assert from_environment({"HOROVOD_GPU_BROADCAST": "MPI"}).gpu_operations["broadcast"] == "MPI"


@pytest.mark.parametrize("variable", ["HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLGATHER"])
def test_an_unknown_gpu_transport_is_refused_naming_the_variable(variable):
    with pytest.raises(ValueError, match=f"{variable}='GLOO' is not one of NCCL, MPI"):
        from_environment({variable: "GLOO"})


# ----------------------------------------------------------------------------- ignored variables


def test_the_gpu_variables_are_implemented_not_warned_about():
    env = {"HOROVOD_GPU_OPERATIONS": "MPI", "HOROVOD_GPU_REDUCESCATTER": "NCCL", "HOROVOD_GPU": "CUDA"}
    assert ignored_variables(env) == ["HOROVOD_GPU is set but not implemented by hvdtrain; ignored"]


def test_ignored_horovod_variables_are_named_with_the_nearest_known_one():
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_FUSION_TRESHOLD": "1024",
           "HOROVOD_FUSION_THRESHOLD": "1024", "HOROVOD_CYCLE_TIME": "2", "HOROVOD_SOMETHING_ELSE": "x",
           "HVDTRAIN_CHUNK_BYTES": "4096", "PATH": "/bin"}
    assert ignored_variables(env) == [
        "HOROVOD_AUTOTUNE is set but not implemented by hvdtrain; ignored",
        "HOROVOD_FUSION_TRESHOLD is set but is not a Horovod 0.28 variable (did you mean "
        "HOROVOD_FUSION_THRESHOLD?); ignored",
        "HOROVOD_HIERARCHICAL_ALLREDUCE is set but not implemented by hvdtrain; ignored",
        "HOROVOD_SOMETHING_ELSE is set but is not a Horovod 0.28 variable; ignored",
    ]


def test_each_local_ranks_engine_thread_takes_its_core_of_horovod_thread_affinity():
    assert [engine_core((1, 0), local_rank, 2) for local_rank in (0, 1)] == [1, 0]
    assert engine_core((), 0, 2) is None


def test_a_thread_affinity_with_fewer_cores_than_local_ranks_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^environment variable HOROVOD_THREAD_AFFINITY='0' names 1 cores, one for "
                                         r"each local rank, but this host has 2 ranks$"):
        engine_core((0,), 0, 2)


def test_a_core_this_process_may_not_run_on_is_refused_naming_it():
    beyond = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ValueError, match=f"core {beyond}, local rank 0's, is not among the cores this process may "
                                         f"run on"):
        engine_core((beyond,), 0, 1)


def test_a_handler_the_program_gave_the_engines_logger_keeps_its_own_format(monkeypatch):
    logger = logging.getLogger("hvdtrain.core")
    own = logging.StreamHandler()
    own.setFormatter(logging.Formatter("mine: %(message)s"))
    monkeypatch.setattr(logger, "handlers", [own])
    core._configure_logging(logging.WARNING, hide_time=True)
    assert logger.handlers == [own]
    assert own.format(logging.LogRecord("hvdtrain.core", logging.WARNING, __file__, 1, "a warning", (), None)) == \
        "mine: a warning"
