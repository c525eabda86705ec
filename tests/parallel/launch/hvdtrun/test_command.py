"""`hvdtrun`, horovodrun for hvdtrain (hvdtrain/launch/hvdtrun/command.py): Horovod-style scripts
started as a Horovod user starts them, as real jobs under mpirun: the ranks of -np or of a
hostfile, horovodrun's tuning flags reaching every rank's engine, the network interface reaching
Open MPI and NCCL, a failing rank failing the job once, a rank that has not ended when mpirun
ends, Ctrl-C, and a job whose ranks do not start in time. The command line alone:
tests/single/launch/hvdtrun/test_command.py."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

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

def run_hvdtrun(*args, cwd=None, env=None, timeout=120):
    return run_command([HVDTRUN, *args], cwd=cwd, env=env, timeout=timeout)


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


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(what each of 2 ranks started with horovodrun's tuning flags found in its environment and
    its engine's settings, in rank order; the timeline's path)."""
    where = tmp_path_factory.mktemp("tuned")
    (where / "settings.py").write_text(SETTINGS_SCRIPT)
    timeline = where / "timeline.json"
    result = run_hvdtrun(
        "-np", "2", "-H", "localhost:2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
        "--cache-capacity", "256", f"--timeline-filename={timeline}", "--timeline-mark-cycles", "--no-stall-check",
        "--stall-check-warning-time-seconds", "7", "--stall-check-shutdown-time-seconds", "9", "--log-level", "debug",
        "--mpi-args=-x 'FROM_MPI_ARGS=two words'", sys.executable, "settings.py",
        cwd=where, env={"HOROVOD_START_TIMEOUT": "40"})
    assert result.returncode == 0, result.stdout + result.stderr
    reports = rank_reports(result.stdout)
    assert [report["rank"] for report in reports] == ["0", "1"], result.stdout
    return reports, timeline


def test_tuning_flags_reach_every_rank_as_the_horovod_variables(tuned):
    reports, timeline = tuned
    for report in reports:
        # hvdtrun's own HOROVOD_START_TIMEOUT does not reach the ranks, whose engine would call it ignored
        assert report["variables"] == {
            "HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "2.5",
            "HOROVOD_CACHE_CAPACITY": "256", "HOROVOD_TIMELINE": str(timeline), "HOROVOD_TIMELINE_MARK_CYCLES": "1",
            "HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "7",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "9", "HOROVOD_LOG_LEVEL": "DEBUG", "FROM_MPI_ARGS": "two words",
        }


def test_every_ranks_engine_reads_the_fusion_threshold_cycle_time_and_cache(tuned):
    reports, _ = tuned
    for report in reports:
        assert report["fusion_threshold_bytes"] == 32 * 1024 * 1024
        assert report["cycle_time_s"] == pytest.approx(0.0025)
        assert report["cache_capacity"] == 256


def test_every_ranks_engine_reads_the_timeline_settings(tuned):
    reports, timeline = tuned
    for report in reports:
        assert report["timeline_path"] == str(timeline)
        assert report["timeline_mark_cycles"] is True


def test_every_ranks_engine_reads_the_stall_check_settings(tuned):
    reports, _ = tuned
    for report in reports:
        assert report["stall_check_enabled"] is False
        assert (report["stall_check_time_s"], report["stall_shutdown_time_s"]) == (7, 9)


def test_every_ranks_engine_reads_the_log_level(tuned):
    reports, _ = tuned
    for report in reports:
        assert report["log_level"] == 10  # logging.DEBUG


def default_route_interface():
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        interface, destination = line.split()[:2]
        if destination == "00000000":
            return interface
    return None


@pytest.fixture(scope="module")
def on_the_default_routes_interface(tmp_path_factory):
    """(the interface, what `hvdtrun -np 2 --verbose --network-interface IT` gave). Open MPI's
    daemons refuse loopback: this takes the interface of the default route."""
    interface = default_route_interface()
    if interface is None:
        pytest.skip("this machine has no default route")
    where = tmp_path_factory.mktemp("interface")
    (where / "settings.py").write_text(SETTINGS_SCRIPT)
    result = run_hvdtrun("-np", "2", "--verbose", "--network-interface", interface, sys.executable, "settings.py",
                         cwd=where)
    assert result.returncode == 0, result.stdout + result.stderr
    return interface, result


def test_the_network_interface_goes_to_open_mpi(on_the_default_routes_interface):
    interface, result = on_the_default_routes_interface
    assert f"--mca btl_tcp_if_include {interface} --mca oob_tcp_if_include {interface}" in result.stderr


def test_the_network_interface_goes_to_nccl(on_the_default_routes_interface):
    interface, result = on_the_default_routes_interface
    assert [report["variables"]["NCCL_SOCKET_IFNAME"] for report in rank_reports(result.stdout)] == [interface] * 2


def test_verbose_says_when_all_ranks_started(on_the_default_routes_interface):
    _, result = on_the_default_routes_interface
    assert "hvdtrun: all 2 ranks started in" in result.stderr


@pytest.fixture(scope="module")
def rank_1_failed(tmp_path_factory):
    """(what `hvdtrun -np 2` gave for a script whose rank 1 raises while rank 0 sleeps, its seconds)."""
    where = tmp_path_factory.mktemp("fails")
    (where / "fails.py").write_text(textwrap.dedent("""\
        import os, time
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            raise RuntimeError("rank 1 fails on purpose")
        time.sleep(120)
    """))
    started = time.monotonic()
    result = run_hvdtrun("-np", "2", sys.executable, "fails.py", cwd=where)
    return result, time.monotonic() - started


def test_a_failing_rank_fails_the_job(rank_1_failed):
    result, _ = rank_1_failed
    assert result.returncode != 0


def test_a_failing_rank_stops_the_others(rank_1_failed):
    _, seconds = rank_1_failed
    assert seconds < 60, "rank 0 was not stopped when rank 1 failed"


def test_a_failing_ranks_error_is_shown_once(rank_1_failed):
    result, _ = rank_1_failed
    assert result.stderr.count("RuntimeError: rank 1 fails on purpose") == 1, result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr


def test_a_job_a_rank_of_which_did_not_end_with_mpirun_fails_naming_it(tmp_path):
    """mpirun's status 0 is not the job's end while a rank's connection to hvdtrun stays open:
    here a process that rank 1 forked holds it after the rank has ended (as a rank on a lost
    host would; tests/cluster/test_cluster_failure.py loses a host)."""
    (tmp_path / "forks.py").write_text(textwrap.dedent("""\
        import os, time
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1" and os.fork() == 0:
            os.close(1), os.close(2)  # not mpirun's output: only hvdtrun's connection outlives the rank
            time.sleep(15)
            os._exit(0)
    """))
    # hvdtrun waiting 2 s, not 30, for the ranks' connections to close
    hvdtrun = ("import sys; from hvdtrain.launch.hvdtrun import command, rank_watch; rank_watch.END_GRACE_S = 2; "
               "command.main(sys.argv[1:])")
    result = run_command([sys.executable, "-c", hvdtrun, "-np", "2", sys.executable, "forks.py"], cwd=tmp_path,
                         timeout=120)
    assert result.returncode == 75, result.stdout + result.stderr
    assert ("hvdtrun: mpirun ended with status 0, but rank 1 (from 127.0.0.1) had not ended" in result.stderr), \
        result.stderr


def test_output_filename_writes_each_ranks_output_to_its_files_and_the_console_as_well(tmp_path):
    result = run_hvdtrun("-np", "2", "--output-filename", "out", sys.executable, "-c",
                         "import os, sys; rank = os.environ['OMPI_COMM_WORLD_RANK']; print('out', rank); "
                         "print('err', rank, file=sys.stderr)", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.splitlines()) == ["out 0", "out 1"]
    assert sorted(result.stderr.splitlines()) == ["err 0", "err 1"]
    assert {str(path.relative_to(tmp_path / "out")): path.read_text() for path in (tmp_path / "out").rglob("std*")} == {
        "rank.0/stdout": "out 0\n", "rank.0/stderr": "err 0\n", "rank.1/stdout": "out 1\n", "rank.1/stderr": "err 1\n"}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """(hvdtrun's exit status and stderr after Ctrl-C while both ranks sleep, the mark on the
    ranks' command line)."""
    where = tmp_path_factory.mktemp("interrupted")
    marker = f"hvdtrun-ctrl-c-{os.getpid()}"
    (where / "sleeps.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    process = subprocess.Popen([HVDTRUN, "-np", "2", sys.executable, "sleeps.py", marker], cwd=where, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert [process.stdout.readline(), process.stdout.readline()] == ["started\n"] * 2
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, stderr, marker


def test_ctrl_c_ends_hvdtrun_with_status_130(interrupted):
    status, _, _ = interrupted
    assert status == 130


def test_ctrl_c_says_the_job_was_stopped(interrupted):
    _, stderr, _ = interrupted
    assert stderr.strip() == "hvdtrun: interrupted; the job was stopped"


def test_ctrl_c_stops_every_process_of_the_job(interrupted):
    _, _, marker = interrupted
    assert processes_mentioning(marker) == []


@pytest.fixture(scope="module")
def never_started(tmp_path_factory):
    """(what hvdtrun gave for one rank on a "remote" host whose agent, in place of ssh, answers
    hvdtrun's probe (`HOST true`) but never starts Open MPI's daemon there, with --start-timeout 1;
    its seconds; the agent)."""
    agent = tmp_path_factory.mktemp("agent") / "agent_that_hangs.sh"
    agent.write_text('#!/bin/sh\n[ "$2" = true ] && exit 0\nsleep 120\n')
    agent.chmod(0o755)
    started = time.monotonic()
    result = run_hvdtrun("-np", "1", "-H", "127.0.0.2:1", "--start-timeout", "1",
                         f"--mpi-args=--mca plm_ssh_agent {agent}", sys.executable, "-c", "pass", timeout=60)
    return result, time.monotonic() - started, agent


def test_a_job_whose_ranks_do_not_start_in_time_is_stopped_saying_which(never_started):
    result, _, _ = never_started
    assert result.returncode == 1, result.stdout + result.stderr
    assert "hvdtrun: 1 of 1 ranks had not started after 1 s (rank 0); the job was stopped" in result.stderr


def test_a_job_whose_ranks_do_not_start_is_stopped_soon_after_the_timeout(never_started):
    _, seconds, _ = never_started
    assert seconds < 30


def test_a_job_stopped_at_its_start_stops_the_agent_too(never_started):
    _, _, agent = never_started
    wait_until(lambda: not processes_mentioning(str(agent)), 10, "the agent to be stopped with the job")
