"""horovodrun's --config-file for hvdtrun (hvdtrain/launch/hvdtrun/config_file.py): horovodrun's
YAML sections become the flags they stand for, the command line's flags win over the file's, and
what hvdtrun does not do, a key horovodrun does not read, or a file that cannot be read is refused
in one line naming the file (and the key)."""

import textwrap

import pytest

from hvdtrain.launch.hvdtrun import command as hvdtrun

SUPPORTED = """\
    controller: mpi
    params: {fusion_threshold_mb: 32, cycle_time_ms: 10, cache_capacity: 2048, hierarchical_allreduce: false}
    autotune: {enabled: false, warmup_samples: 5}
    timeline: {filename: timeline.json, mark_cycles: true}
    stall_check: {enabled: false, warning_time_seconds: 120, shutdown_time_seconds: 240}
    library_options: {mpi_threads_disable: false}
    logging: {level: info, hide_timestamp: true}
"""


def parsed(tmp_path, text, *flags):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return hvdtrun.parse_command_line(["-np", "2", "--config-file", str(path), *flags, "python", "train.py"]), path


def test_horovodruns_sections_become_the_engines_variables(tmp_path):
    options, _ = parsed(tmp_path, SUPPORTED)
    assert hvdtrun.engine_variables(options) == {
        "HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "10.0",
        "HOROVOD_CACHE_CAPACITY": "2048", "HOROVOD_TIMELINE": "timeline.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "240", "HOROVOD_LOG_LEVEL": "INFO", "HOROVOD_LOG_HIDE_TIME": "1"}
    assert options.command == ["python", "train.py"]


def test_the_command_lines_flags_win_over_the_files(tmp_path):
    options, _ = parsed(tmp_path, SUPPORTED, "--fusion-threshold-mb", "256", "--stall-check", "--cycle-time-ms", "20")
    assert (options.fusion_threshold_mb, options.no_stall_check, options.cycle_time_ms) == (256, False, 20.0)


@pytest.mark.parametrize("text, refusal", [
    ("controller: gloo\n", "--gloo is not supported by hvdtrun (hvdtrain has no Gloo controller; it runs on MPI)"),
    ("params: {hierarchical_allreduce: true}\n", "--hierarchical-allreduce is not supported by hvdtrun "
                                                 "(hvdtrain's engine has no hierarchical allreduce)"),
    ("autotune: {enabled: true}\n", "--autotune is not supported by hvdtrun (hvdtrain does not autotune; set "
                                    "--fusion-threshold-mb and --cycle-time-ms yourself)"),
    ("params: {fusion_threshold_mb: lots}\n", "argument --fusion-threshold-mb: 'lots': must be a whole number of "
                                              "0 or more"),
])
def test_what_hvdtrun_does_not_do_is_refused_naming_the_file_and_the_flags_reason(tmp_path, text, refusal):
    with pytest.raises(hvdtrun.UsageError) as refused:
        parsed(tmp_path, text)
    assert str(refused.value) == f"--config-file {tmp_path / 'config.yaml'}: {refusal}"


@pytest.mark.parametrize("text, refusal", [
    ("parameters: {cache_capacity: 0}\n", "parameters: not one of horovodrun's sections (controller, params, "
                                          "autotune, timeline, stall_check, library_options, logging)"),
    ("params: {cache: 0}\n", "params.cache: not one of horovodrun's settings of params (cache_capacity, "
                             "cycle_time_ms, fusion_threshold_mb, hierarchical_allgather, hierarchical_allreduce, "
                             "torus_allreduce)"),
    ("timeline: {mark_cycles: often}\n", "timeline.mark_cycles: 'often' is not true or false"),
    ("controller: nccl\n", "controller: 'nccl' is neither mpi nor gloo"),
    ("params: [1, 2]\n", "params: a mapping of its settings is expected"),
    ("params: {cache_capacity: [\n", "not YAML (while parsing a flow node)"),
])
def test_a_key_horovodrun_does_not_read_or_a_bad_value_is_refused_naming_it(tmp_path, text, refusal):
    with pytest.raises(hvdtrun.UsageError) as refused:
        parsed(tmp_path, text)
    assert str(refused.value) == f"--config-file {tmp_path / 'config.yaml'}: {refusal}"


def test_a_missing_file_is_refused_naming_it(tmp_path):
    with pytest.raises(hvdtrun.UsageError, match=f"^--config-file {tmp_path}/none.yaml: No such file or directory$"):
        hvdtrun.parse_command_line(["-np", "2", "--config-file", str(tmp_path / "none.yaml"), "python", "train.py"])
