"""`hvdtrun`, horovodrun for hvdtrain: Horovod-style scripts started as a Horovod user starts them,
as real jobs under mpirun, and the flags it refuses."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hvdtrain.core import horovod_api
from hvdtrain.launch.hvdtrun import command as hvdtrun
from support.commands import processes_mentioning, run_command, wait_until

HVDTRUN = os.path.join(os.path.dirname(sys.executable), "hvdtrun")  # the console script pip installed

ALLREDUCE_SCRIPT = """\
import torch
import hvdtrain.torch as hvd

hvd.init()
tensor = torch.tensor([hvd.rank() + 1.0, 2.0 * (hvd.rank() + 1)])
summed = hvd.allreduce(tensor, op=hvd.Sum, name="summed")
averaged = hvd.allreduce(tensor, name="averaged")
if hvd.rank() == 0:
    print(f"size={hvd.size()} sum={summed.tolist()} average={averaged.tolist()}")
"""

# What each rank's engine makes of its environment (no MPI needed for that).
SETTINGS_SCRIPT = """\
import json, os
from hvdtrain.core import settings

found = settings.from_environment()
print(json.dumps({
    "rank": os.environ["OMPI_COMM_WORLD_RANK"],
    "variables": {name: value for name, value in os.environ.items()
                  if name.startswith("HOROVOD_") or name in ("NCCL_SOCKET_IFNAME", "FROM_MPI_ARGS")},
    "fusion_threshold_bytes": found.fusion_threshold_bytes, "cycle_time_s": found.cycle_time_s,
    "cache_capacity": found.cache_capacity, "timeline_path": found.timeline_path,
    "timeline_mark_cycles": found.timeline_mark_cycles, "stall_check_enabled": found.stall_check_enabled,
    "stall_check_time_s": found.stall_check_time_s, "stall_shutdown_time_s": found.stall_shutdown_time_s,
    "log_level": found.log_level,
}))
"""

# horovodrun 0.28's flags (horovod/runner/launch.py) that hvdtrun does not take, with a value
# where they take one.
UNSUPPORTED = [
    ["--disable-cache"], ["--output-filename", "out"], ["--config-file", "c.yaml"], ["-p", "22"],
    ["--ssh-port", "22"], ["-i", "key"], ["--ssh-identity-file", "key"], ["--hierarchical-allreduce"],
    ["--no-hierarchical-allreduce"], ["--hierarchical-allgather"], ["--no-hierarchical-allgather"],
    ["--torus-allreduce"], ["--no-torus-allreduce"], ["--autotune"], ["--no-autotune"],
    ["--autotune-log-file", "log"], ["--autotune-warmup-samples", "3"], ["--autotune-steps-per-sample", "10"],
    ["--autotune-bayes-opt-max-samples", "20"], ["--autotune-gaussian-process-noise", "0.8"],
    ["--mpi-threads-disable"], ["--no-mpi-threads-disable"], ["--tcp"], ["--binding-args", "x"],
    ["--num-nccl-streams", "2"], ["--thread-affinity", "1"], ["--gloo-timeout-seconds", "30"],
    ["--log-with-timestamp"], ["--log-without-timestamp"], ["-prefix-timestamp"],
    ["--prefix-output-with-timestamp"], ["--log-hide-timestamp"], ["--no-log-hide-timestamp"], ["--gloo"],
    ["--mpi"], ["--jsrun"], ["--blacklist-cooldown-range", "60", "300"],
]
ELASTIC = [  # taken with --host-discovery-script (tests/runner/test_elastic.py runs them)
    ["--min-np", "2"], ["--min-num-proc", "2"], ["--max-np", "4"], ["--max-num-proc", "4"],
    ["--slots-per-host", "2"], ["--elastic-timeout", "600"], ["--reset-limit", "3"],
]


def run_hvdtrun(*args, cwd=None, env=None, timeout=120):
    return run_command([HVDTRUN, *args], cwd=cwd, env=env, timeout=timeout)


def refusal(result):
    """The one line a refused command line gives, after checking that nothing else came."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def rank_reports(stdout):
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return sorted(reports, key=lambda report: report["rank"])


def test_two_ranks_allreduce_exactly(tmp_path):
    (tmp_path / "script.py").write_text(ALLREDUCE_SCRIPT)
    result = run_hvdtrun("-np", "2", sys.executable, "script.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["size=2 sum=[3.0, 6.0] average=[1.5, 3.0]"]


def test_three_ranks_on_the_hosts_of_a_hostfile(tmp_path):
    (tmp_path / "script.py").write_text(ALLREDUCE_SCRIPT)
    (tmp_path / "hosts").write_text("# horovodrun's format\nlocalhost slots=3\n")
    result = run_hvdtrun("-np", "3", "--hostfile", "hosts", sys.executable, "script.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["size=3 sum=[6.0, 12.0] average=[2.0, 4.0]"]


def test_tuning_flags_reach_every_rank_as_the_horovod_variables_the_engine_reads(tmp_path):
    (tmp_path / "settings.py").write_text(SETTINGS_SCRIPT)
    timeline = tmp_path / "timeline.json"
    result = run_hvdtrun(
        "-np", "2", "-H", "localhost:2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
        "--cache-capacity", "256", f"--timeline-filename={timeline}", "--timeline-mark-cycles", "--no-stall-check",
        "--stall-check-warning-time-seconds", "7", "--stall-check-shutdown-time-seconds", "9", "--log-level", "debug",
        "--mpi-args=-x 'FROM_MPI_ARGS=two words'", sys.executable, "settings.py",
        cwd=tmp_path, env={"HOROVOD_START_TIMEOUT": "40"})
    assert result.returncode == 0, result.stdout + result.stderr
    reports = rank_reports(result.stdout)
    assert [report["rank"] for report in reports] == ["0", "1"], result.stdout
    for report in reports:
        # hvdtrun's own HOROVOD_START_TIMEOUT does not reach the ranks, whose engine would call it ignored
        assert report["variables"] == {
            "HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "2.5",
            "HOROVOD_CACHE_CAPACITY": "256", "HOROVOD_TIMELINE": str(timeline), "HOROVOD_TIMELINE_MARK_CYCLES": "1",
            "HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "7",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "9", "HOROVOD_LOG_LEVEL": "DEBUG", "FROM_MPI_ARGS": "two words",
        }
        assert report["fusion_threshold_bytes"] == 32 * 1024 * 1024
        assert report["cycle_time_s"] == pytest.approx(0.0025)
        assert report["cache_capacity"] == 256
        assert report["timeline_path"] == str(timeline)
        assert report["timeline_mark_cycles"] is True
        assert report["stall_check_enabled"] is False
        assert (report["stall_check_time_s"], report["stall_shutdown_time_s"]) == (7, 9)
        assert report["log_level"] == 10  # logging.DEBUG


def default_route_interface():
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        interface, destination = line.split()[:2]
        if destination == "00000000":
            return interface
    return None


def test_network_interface_goes_to_open_mpi_and_nccl(tmp_path):
    # Open MPI's daemons refuse loopback: this takes the interface of the default route.
    interface = default_route_interface()
    if interface is None:
        pytest.skip("this machine has no default route")
    (tmp_path / "settings.py").write_text(SETTINGS_SCRIPT)
    result = run_hvdtrun("-np", "2", "--verbose", "--network-interface", interface, sys.executable, "settings.py",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"--mca btl_tcp_if_include {interface} --mca oob_tcp_if_include {interface}" in result.stderr
    assert [report["variables"]["NCCL_SOCKET_IFNAME"] for report in rank_reports(result.stdout)] == [interface] * 2
    assert "hvdtrun: all 2 ranks started in" in result.stderr


@pytest.mark.parametrize("hosts", [["-H", "localhost:2"], ["--hostfile", "hosts"]])
def test_more_ranks_than_the_hosts_slots_are_refused(tmp_path, hosts):
    (tmp_path / "hosts").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    line = refusal(run_hvdtrun("-np", "3", *hosts, sys.executable, "-c", "pass", cwd=tmp_path))
    assert line.startswith("hvdtrun: -np 3 asks for 3 ranks but ")
    assert line.endswith(" offers only 2 slots")


@pytest.mark.parametrize("flag, reason", [
    (["--gloo"], "hvdtrain has no Gloo controller; it runs on MPI"),
    (["--ssh-port=2222"], "give mpirun's ssh options with --mpi-args"),
    (["--blacklist-cooldown-range", "60", "300"], "hvdtrun does not blacklist hosts"),
])
def test_an_unsupported_flag_is_refused_by_name(flag, reason):
    line = refusal(run_hvdtrun("-np", "2", *flag, sys.executable, "-c", "pass"))
    assert line.startswith(f"hvdtrun: {flag[0].split('=')[0]} is not supported by hvdtrun ({reason}")


def test_an_unknown_flag_is_refused_with_the_nearest_known_one():
    assert refusal(run_hvdtrun("--num-procs", "2", sys.executable, "-c", "pass")) == \
        "hvdtrun: unknown flag --num-procs; did you mean --num-proc?"


@pytest.mark.parametrize("flag", UNSUPPORTED, ids=lambda flag: flag[0])
def test_every_other_horovodrun_flag_is_refused_not_ignored(flag):
    with pytest.raises(hvdtrun.UsageError, match=f"^{flag[0]} is not supported by hvdtrun \\("):
        hvdtrun.parse_command_line(["-np", "2", *flag, "python", "train.py"])


@pytest.mark.parametrize("flag", ELASTIC, ids=lambda flag: flag[0])
def test_the_elastic_flags_need_a_discovery_script(flag):
    name = {"--min-num-proc": "--min-np", "--max-num-proc": "--max-np"}.get(flag[0], flag[0])
    with pytest.raises(hvdtrun.UsageError, match=f"^{name} is for elastic jobs: it needs --host-discovery-script$"):
        hvdtrun.parse_command_line(["-np", "2", *flag, "python", "train.py"])
    elastic = hvdtrun.parse_command_line([*flag, "--host-discovery-script", "discover.sh", "python", "train.py"])
    assert elastic.host_discovery_script == "discover.sh" and elastic.num_proc is None
    with pytest.raises(hvdtrun.UsageError, match="name fixed hosts; an elastic job's come from"):
        hvdtrun.parse_command_line([*flag, "--host-discovery-script", "d.sh", "-H", "a:2", "python", "train.py"])


def test_horovodrun_flags_that_hvdtrun_takes_need_no_change():
    options = hvdtrun.parse_command_line([
        "--num-proc", "4", "--hosts", "a:2,b:2", "--start-timeout", "60", "--verbose", "--network-interfaces",
        "eth0,eth1", "--network-interface", "eth2", "--mpi-args=--map-by ppr:2:node", "--cache-capacity=0",
        "--stall-check", "--no-timeline-mark-cycles", "python", "train.py", "--np", "8"])
    assert (options.num_proc, options.hosts, options.start_timeout, options.verbose) == (4, "a:2,b:2", 60, True)
    assert options.network_interfaces == ["eth0", "eth1", "eth2"]
    assert hvdtrun.mpirun_extra_args(options) == [
        "--mca", "btl_tcp_if_include", "eth0,eth1,eth2", "--mca", "oob_tcp_if_include", "eth0,eth1,eth2",
        "--map-by", "ppr:2:node"]
    assert hvdtrun.engine_variables(options) == {
        "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_STALL_CHECK_DISABLE": "0", "HOROVOD_TIMELINE_MARK_CYCLES": "0"}
    assert options.command == ["python", "train.py", "--np", "8"]  # the command's flags stay the command's


def test_the_start_timeout_comes_from_the_flag_then_horovods_variable_then_30_s():
    given, default = (hvdtrun.parse_command_line([*flags, "python", "train.py"])
                      for flags in (["-np", "2", "--start-timeout", "5"], ["-np", "2"]))
    assert hvdtrun.start_timeout_s(given, {"HOROVOD_START_TIMEOUT": "7"}) == 5
    assert hvdtrun.start_timeout_s(default, {"HOROVOD_START_TIMEOUT": "7"}) == 7
    assert hvdtrun.start_timeout_s(default, {}) == 30
    with pytest.raises(hvdtrun.UsageError, match="HOROVOD_START_TIMEOUT='soon'"):
        hvdtrun.start_timeout_s(default, {"HOROVOD_START_TIMEOUT": "soon"})


def test_check_build_shows_this_install_in_horovodruns_layout():
    result = run_hvdtrun("--check-build", timeout=60)
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


def test_a_failing_script_fails_the_job_with_its_error_once(tmp_path):
    (tmp_path / "fails.py").write_text(textwrap.dedent("""\
        import os, time
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            raise RuntimeError("rank 1 fails on purpose")
        time.sleep(120)
    """))
    started = time.monotonic()
    result = run_hvdtrun("-np", "2", sys.executable, "fails.py", cwd=tmp_path)
    assert result.returncode != 0
    assert time.monotonic() - started < 60, "rank 0 was not stopped when rank 1 failed"
    assert result.stderr.count("RuntimeError: rank 1 fails on purpose") == 1, result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr


def test_ctrl_c_stops_every_process_of_the_job(tmp_path):
    marker = f"hvdtrun-ctrl-c-{os.getpid()}"
    (tmp_path / "sleeps.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    process = subprocess.Popen([HVDTRUN, "-np", "2", sys.executable, "sleeps.py", marker], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert [process.stdout.readline(), process.stdout.readline()] == ["started\n"] * 2
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130
    assert stderr.strip() == "hvdtrun: interrupted; the job was stopped"
    assert processes_mentioning(marker) == []


def test_a_job_whose_ranks_do_not_start_in_time_is_stopped(tmp_path):
    # A "remote" host whose agent (in place of ssh) never starts Open MPI's daemon there.
    agent = tmp_path / "agent_that_hangs.sh"
    agent.write_text("#!/bin/sh\nsleep 120\n")
    agent.chmod(0o755)
    started = time.monotonic()
    result = run_hvdtrun("-np", "1", "-H", "127.0.0.2:1", "--start-timeout", "1",
                         f"--mpi-args=--mca plm_ssh_agent {agent}", sys.executable, "-c", "pass", timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "hvdtrun: 1 of 1 ranks had not started after 1 s (rank 0); the job was stopped" in result.stderr
    assert time.monotonic() - started < 30
    wait_until(lambda: not processes_mentioning(str(agent)), 10, "the agent to be stopped with the job")
