"""`hvdtrun`'s command line (hvdtrain/launch/hvdtrun/command.py), in this process: horovodrun's
flags that hvdtrun takes need no change, every other one of horovodrun 0.28's is refused by name
rather than ignored, an unknown flag names the nearest known one, more ranks than the hosts'
slots are refused, the elastic flags need a discovery script, the start timeout's sources, and
--check-build in horovodrun's layout without importing a framework. Jobs started:
tests/parallel/launch/hvdtrun/test_command.py."""

import contextlib
import importlib.util
import io
import subprocess
import sys

import pytest

from hvdtrain.core import horovod_api
from hvdtrain.launch import mpirun
from hvdtrain.launch.hvdtrun import command as hvdtrun
from hvdtrain.run.hosts import Host

from support.commands import run_command

# horovodrun 0.28's flags (horovod/runner/launch.py) that hvdtrun does not take, with a value
# where they take one.
UNSUPPORTED = [
    ["--hierarchical-allreduce"],
    ["--hierarchical-allgather"], ["--torus-allreduce"], ["--autotune"],
    ["--autotune-log-file", "log"], ["--autotune-warmup-samples", "3"], ["--autotune-steps-per-sample", "10"],
    ["--autotune-bayes-opt-max-samples", "20"], ["--autotune-gaussian-process-noise", "0.8"],
    ["--mpi-threads-disable"],
    ["--num-nccl-streams", "2"], ["--gloo-timeout-seconds", "30"], ["--gloo"],
    ["--jsrun"],
]
# ... and those that ask for what hvdtrun does anyway, taken as they are.
ALREADY_SO = ["--disable-cache", "--no-hierarchical-allreduce", "--no-hierarchical-allgather",
              "--no-torus-allreduce", "--no-autotune", "--no-mpi-threads-disable", "--mpi"]
ELASTIC = [  # taken with --host-discovery-script (tests/integration/launch/hvdtrun/test_elastic.py runs them)
    ["--min-np", "2"], ["--min-num-proc", "2"], ["--max-np", "4"], ["--max-num-proc", "4"],
    ["--slots-per-host", "2"], ["--elastic-timeout", "600"], ["--reset-limit", "3"],
    ["--blacklist-cooldown-range", "60", "300"],
]


def hvdtrun_here(*args, monkeypatch, cwd=None):
    """`hvdtrun ARGS` run in this process, for what it decides before it starts a job: the
    CompletedProcess a subprocess would give."""
    if cwd is not None:
        monkeypatch.chdir(cwd)
    stdout, stderr = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            hvdtrun.main(list(args))
        except SystemExit as exit:
            status = exit.code or 0
    return subprocess.CompletedProcess(["hvdtrun", *args], status, stdout.getvalue(), stderr.getvalue())


def refusal(result):
    """The one line a refused command line gives, after checking that nothing else came."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("hosts", [["-H", "localhost:2"], ["--hostfile", "hosts"]])
def test_more_ranks_than_the_hosts_slots_are_refused(tmp_path, monkeypatch, hosts):
    (tmp_path / "hosts").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    line = refusal(hvdtrun_here("-np", "3", *hosts, sys.executable, "-c", "pass", monkeypatch=monkeypatch,
                                cwd=tmp_path))
    assert line.startswith("hvdtrun: -np 3 asks for 3 ranks but ")
    assert line.endswith(" offers only 2 slots")


@pytest.mark.parametrize("flag, reason", [
    (["--gloo"], "hvdtrain has no Gloo controller; it runs on MPI"),
    (["--num-nccl-streams=2"], "HOROVOD_NUM_NCCL_STREAMS is not implemented by hvdtrain"),
])
def test_an_unsupported_flag_is_refused_by_name(flag, reason, monkeypatch):
    line = refusal(hvdtrun_here("-np", "2", *flag, sys.executable, "-c", "pass", monkeypatch=monkeypatch))
    assert line.startswith(f"hvdtrun: {flag[0].split('=')[0]} is not supported by hvdtrun ({reason}")


def test_an_unknown_flag_is_refused_with_the_nearest_known_one(monkeypatch):
    assert refusal(hvdtrun_here("--num-procs", "2", sys.executable, "-c", "pass", monkeypatch=monkeypatch)) == \
        "hvdtrun: unknown flag --num-procs; did you mean --num-proc?"


@pytest.mark.parametrize("flag", UNSUPPORTED, ids=lambda flag: flag[0])
def test_every_other_horovodrun_flag_is_refused_not_ignored(flag):
    with pytest.raises(hvdtrun.UsageError, match=f"^{flag[0]} is not supported by hvdtrun \\("):
        hvdtrun.parse_command_line(["-np", "2", *flag, "python", "train.py"])


def test_the_flags_that_ask_for_what_hvdtrun_does_anyway_are_taken_and_the_command_stays_the_commands():
    options = hvdtrun.parse_command_line(["-np", "2", *ALREADY_SO, "python", "train.py", "--mpi"])
    assert options.command == ["python", "train.py", "--mpi"]


@pytest.mark.parametrize("flag", ELASTIC, ids=lambda flag: flag[0])
def test_the_elastic_flags_need_a_discovery_script_or_the_min_np(flag):
    name = {"--min-num-proc": "--min-np", "--max-num-proc": "--max-np"}.get(flag[0], flag[0])
    if name != "--min-np":
        with pytest.raises(hvdtrun.UsageError, match=f"^{name} is for elastic jobs: it needs --host-discovery-script, "
                                                     f"or --min-np on fixed hosts$"):
            hvdtrun.parse_command_line(["-np", "2", *flag, "python", "train.py"])
    elastic = hvdtrun.parse_command_line([*flag, "--host-discovery-script", "discover.sh", "python", "train.py"])
    assert elastic.host_discovery_script == "discover.sh" and elastic.num_proc is None
    with pytest.raises(hvdtrun.UsageError, match="name fixed hosts; an elastic job's come from"):
        hvdtrun.parse_command_line([*flag, "--host-discovery-script", "d.sh", "-H", "a:2", "python", "train.py"])


def test_the_min_np_on_fixed_hosts_makes_an_elastic_job_on_them_as_with_horovodrun():
    options = hvdtrun.parse_command_line(["--min-np", "2", "--max-np", "4", "-H", "a:2,b:2", "python", "train.py"])
    assert hvdtrun.is_elastic(options)
    assert hvdtrun.job_hosts(options) == [Host("a", 2), Host("b", 2)]


def test_the_min_np_beyond_the_fixed_hosts_slots_is_refused():
    with pytest.raises(hvdtrun.UsageError, match="^--min-np 3 asks for at least 3 ranks but -H a:2 offers only 2 "
                                                 "slots$"):
        hvdtrun.job_hosts(hvdtrun.parse_command_line(["--min-np", "3", "-H", "a:2", "python", "train.py"]))


def test_the_min_np_without_hosts_makes_an_elastic_job_on_this_machine_of_max_np_slots():
    options = hvdtrun.parse_command_line(["--min-np", "2", "--max-np", "3", "python", "train.py"])
    assert hvdtrun.job_hosts(options) == [Host("localhost", 3)]


@pytest.fixture(scope="module")
def horovodrun_command_line():
    """What hvdtrun makes of a command line written for horovodrun."""
    return hvdtrun.parse_command_line([
        "--num-proc", "4", "--hosts", "a:2,b:2", "--start-timeout", "60", "--verbose", "--network-interfaces",
        "eth0,eth1", "--network-interface", "eth2", "--mpi-args=--map-by ppr:2:node", "--cache-capacity=0",
        "--stall-check", "--no-timeline-mark-cycles", "python", "train.py", "--np", "8"])


def test_horovodruns_job_flags_are_taken_as_they_are(horovodrun_command_line):
    options = horovodrun_command_line
    assert (options.num_proc, options.hosts, options.start_timeout, options.verbose) == (4, "a:2,b:2", 60, True)


def test_network_interfaces_given_as_a_list_and_one_by_one_add_up(horovodrun_command_line):
    assert horovodrun_command_line.network_interfaces == ["eth0", "eth1", "eth2"]


def test_the_network_interfaces_and_mpi_args_go_to_mpirun(horovodrun_command_line):
    assert hvdtrun.mpirun_extra_args(horovodrun_command_line) == [
        "--mca", "btl_tcp_if_include", "eth0,eth1,eth2", "--mca", "oob_tcp_if_include", "eth0,eth1,eth2",
        "--map-by", "ppr:2:node"]


def test_the_tuning_flags_become_the_engines_horovod_variables(horovodrun_command_line):
    assert hvdtrun.engine_variables(horovodrun_command_line) == {
        "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_STALL_CHECK_DISABLE": "0", "HOROVOD_TIMELINE_MARK_CYCLES": "0"}


@pytest.mark.parametrize("flag, hidden", [("--log-hide-timestamp", "1"), ("--log-without-timestamp", "1"),
                                          ("--log-with-timestamp", "0"), ("--no-log-hide-timestamp", "0")])
def test_the_log_timestamp_flags_become_horovods_log_hide_time(flag, hidden):
    options = hvdtrun.parse_command_line(["-np", "2", flag, "python", "train.py"])
    assert hvdtrun.engine_variables(options) == {"HOROVOD_LOG_HIDE_TIME": hidden}


def test_the_ssh_port_and_identity_file_become_open_mpis_ssh_arguments():
    options = hvdtrun.parse_command_line(["-np", "2", "-p", "2222", "-i", "/keys/id ed", "python", "train.py"])
    assert hvdtrun.mpirun_extra_args(options) == ["--mca", "plm_ssh_args", "-p 2222 -i '/keys/id ed'"]


def test_the_hosts_are_probed_with_the_ssh_arguments_mpirun_will_use():
    options = hvdtrun.parse_command_line(["-np", "2", "--ssh-port", "2222", "python", "train.py"])
    assert mpirun.remote_agent(hvdtrun.mpirun_extra_args(options), {}) == ["ssh", "-o", "BatchMode=yes", "-p", "2222"]


def test_ssh_flags_beside_a_remote_agent_of_the_mpi_args_are_refused():
    options = hvdtrun.parse_command_line(["-np", "2", "-p", "2222", "--mpi-args=--mca plm_ssh_agent rsh",
                                          "python", "train.py"])
    with pytest.raises(hvdtrun.UsageError, match="give them in --mpi-args$"):
        hvdtrun.mpirun_extra_args(options)


def test_binding_args_take_the_place_of_the_default_binding():
    options = hvdtrun.parse_command_line(["-np", "2", "--binding-args=--bind-to core --map-by socket", "python", "x"])
    command = mpirun.mpirun_command(["x"], num_proc=2, binding=hvdtrun.binding_args(options))
    assert command[command.index("-H") + 2:-1] == ["--bind-to", "core", "--map-by", "socket"]


def test_without_binding_args_the_ranks_are_unbound_and_mapped_by_slot_as_horovodrun_has_them():
    options = hvdtrun.parse_command_line(["-np", "2", "python", "x"])
    command = mpirun.mpirun_command(["x"], num_proc=2, binding=hvdtrun.binding_args(options))
    assert command[command.index("-H") + 2:-1] == ["--bind-to", "none", "--map-by", "slot"]


def test_tcp_has_open_mpi_carry_the_ranks_traffic_over_tcp():
    options = hvdtrun.parse_command_line(["-np", "2", "--tcp", "python", "train.py"])
    assert hvdtrun.mpirun_extra_args(options) == ["--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp"]


def test_output_files_have_mpirun_tag_each_line_with_its_rank_and_stamp_it_where_asked():
    options = hvdtrun.parse_command_line(["-np", "2", "--output-filename", "out", "python", "x"])
    assert hvdtrun.mpirun_extra_args(options) == ["--output", "tag"]
    options = hvdtrun.parse_command_line(["-np", "2", "--output-filename", "out", "-prefix-timestamp", "python", "x"])
    assert hvdtrun.mpirun_extra_args(options) == ["--output", "tag,timestamp"]


@pytest.mark.parametrize("flag", ["-prefix-timestamp", "--prefix-output-with-timestamp"])
def test_prefixing_the_output_with_timestamps_has_mpirun_stamp_each_line(flag):
    options = hvdtrun.parse_command_line(["-np", "2", flag, "python", "train.py"])
    assert hvdtrun.mpirun_extra_args(options) == ["--output", "timestamp"]


def test_the_thread_affinity_becomes_horovods_variable():
    options = hvdtrun.parse_command_line(["-np", "2", "--thread-affinity", "3,1", "python", "train.py"])
    assert hvdtrun.engine_variables(options) == {"HOROVOD_THREAD_AFFINITY": "3,1"}


def test_the_commands_flags_stay_the_commands(horovodrun_command_line):
    assert horovodrun_command_line.command == ["python", "train.py", "--np", "8"]


@pytest.fixture(scope="module")
def start_timeouts():
    """(a command line with --start-timeout 5, one without)."""
    return tuple(hvdtrun.parse_command_line([*flags, "python", "train.py"])
                 for flags in (["-np", "2", "--start-timeout", "5"], ["-np", "2"]))


def test_the_start_timeout_flag_comes_first(start_timeouts):
    given, _ = start_timeouts
    assert hvdtrun.start_timeout_s(given, {"HOROVOD_START_TIMEOUT": "7"}) == 5


def test_without_the_flag_the_start_timeout_is_horovods_variable(start_timeouts):
    _, default = start_timeouts
    assert hvdtrun.start_timeout_s(default, {"HOROVOD_START_TIMEOUT": "7"}) == 7


def test_without_either_the_start_timeout_is_30_s(start_timeouts):
    _, default = start_timeouts
    assert hvdtrun.start_timeout_s(default, {}) == 30


def test_a_start_timeout_variable_that_is_no_number_is_refused(start_timeouts):
    _, default = start_timeouts
    with pytest.raises(hvdtrun.UsageError, match="HOROVOD_START_TIMEOUT='soon'"):
        hvdtrun.start_timeout_s(default, {"HOROVOD_START_TIMEOUT": "soon"})


@pytest.mark.parametrize("variables, problem", [
    ({"HOROVOD_FUSION_THRESHOLD": "abc"}, "HOROVOD_FUSION_THRESHOLD='abc' is not a valid int"),
    ({"HVDTRAIN_CHUNK_BYTES": "0"}, "HVDTRAIN_CHUNK_BYTES must be positive"),
    ({"HOROVOD_TIMELINE": "/no/such/folder/timeline.json"},
     "HOROVOD_TIMELINE='/no/such/folder/timeline.json': folder /no/such/folder does not exist"),
])
def test_a_variable_the_ranks_would_refuse_is_refused_in_one_line_before_launching(variables, problem, monkeypatch):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    line = refusal(hvdtrun_here("-np", "2", "python", "train.py", monkeypatch=monkeypatch))
    assert line == f"hvdtrun: environment variable {problem}"


def test_a_host_that_does_not_answer_the_agent_is_refused_in_one_line(tmp_path, monkeypatch):
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/bin/sh\nexit 255\n")
    agent.chmod(0o755)
    monkeypatch.setenv("OMPI_MCA_plm_ssh_agent", str(agent))
    line = refusal(hvdtrun_here("-np", "2", "-H", "nosuchhost:2", "python", "train.py", monkeypatch=monkeypatch))
    assert line == f"hvdtrun: host nosuchhost does not answer `{agent} nosuchhost true` within 15 s"


@pytest.mark.parametrize("command, problem", [
    (["nosuchprogram", "x"], "nosuchprogram: no such program (not a file, nor on PATH)"),
    (["python", "-u", "/nonexistent.py"], "/nonexistent.py: no such file, for python to run"),
])
def test_a_command_that_cannot_start_here_is_refused_in_one_line(command, problem, monkeypatch):
    assert refusal(hvdtrun_here("-np", "2", *command, monkeypatch=monkeypatch)) == f"hvdtrun: {problem}"


def test_check_build_shows_this_install_in_horovodruns_layout(monkeypatch):
    result = hvdtrun_here("--check-build", monkeypatch=monkeypatch)
    assert result.returncode == 0, result.stderr

    def mark(available):
        return "X" if available else " "

    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines[1:] == [
        "", "Available Frameworks:", f"[{mark(importlib.util.find_spec('tensorflow'))}] TensorFlow",
        "[X] PyTorch", "[ ] MXNet",
        "", "Available Controllers:", "[X] MPI", "[ ] Gloo",
        "", "Available Tensor Operations:", f"[{mark(horovod_api.nccl_built())}] NCCL", "[ ] DDL", "[ ] CCL",
        "[X] MPI", "[ ] Gloo",
    ]


def test_check_build_imports_no_framework():
    probe = ("import sys; from hvdtrain.launch.hvdtrun import command as hvdtrun; hvdtrun.check_build_report(); "
             "print(sorted({'torch', 'tensorflow'} & set(sys.modules)))")
    result = run_command([sys.executable, "-c", probe], timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.parametrize("low, high", [("300", "60"), ("1", "3601")])
def test_a_cooldown_range_out_of_order_or_past_an_hour_is_refused(low, high):
    with pytest.raises(hvdtrun.UsageError, match=f"^--blacklist-cooldown-range {low} {high}: MIN must be at most "
                                                 "MAX, and MAX at most 3600 s$"):
        hvdtrun.parse_command_line(["--host-discovery-script", "discover.sh", "--blacklist-cooldown-range", low, high,
                                    "python", "train.py"])
