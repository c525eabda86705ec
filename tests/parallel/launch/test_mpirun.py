"""Where mpirun keeps its session directory (hvdtrain/launch/mpirun.py): in a temporary directory of
each launch, which it removes, so that what a killed mpirun leaves behind cannot stop a later
one."""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hvdtrain.launch import mpirun as launcher
from support.commands import wait_until

PRINT_SESSION = "import os; print(os.getppid(), os.environ['PMIX_SERVER_TMPDIR'])"


def launch(env=None):
    """(mpirun's pid, its session directory) as one rank sees them, and the run's status."""
    environment = launcher.worker_environment(1, {**os.environ, **(env or {})})
    command = launcher.mpirun_command([sys.executable, "-c", PRINT_SESSION], num_proc=1, env=environment)
    result = launcher.run(command, env=environment, timeout=60, capture=True)
    pid, session = result.stdout.split()[-2:] if result.returncode == 0 else (None, None)
    return result, int(pid) if pid else None, session


@pytest.fixture(scope="module")
def launched():
    """(mpirun's pid, its session directory) as the one rank of a launch saw them."""
    result, mpirun_pid, session = launch()
    assert result.returncode == 0, result.stdout
    return mpirun_pid, Path(session)


def test_each_launch_keeps_the_session_directory_in_a_temporary_directory_of_its_own(launched):
    _, session = launched
    base = session.parent
    assert base.parent == Path(tempfile.gettempdir()) and base.name.startswith("hvdtrain-mpirun-"), session


def test_the_session_directory_is_named_by_mpiruns_pid(launched):
    mpirun_pid, session = launched
    assert session.name == f"ompi.{mpirun_pid}"


def test_the_launch_removes_its_temporary_directory(launched):
    _, session = launched
    assert not session.parent.exists()


def killed_mpirun_leftovers(tmp_dir):
    """Start an mpirun with its session directory under `tmp_dir`, kill it with all of its job
    before it can clean up, and return its pid: tmp_dir/ompi.PID is left behind."""
    env = launcher.worker_environment(1, {**os.environ, "TMPDIR": str(tmp_dir)})
    process = subprocess.Popen([launcher.mpirun_executable(), "-n", "1", "sleep", "60"], env=env,
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    session = tmp_dir / f"ompi.{process.pid}"
    wait_until(lambda: len(launcher.session_members(process.pid)) >= 2, 30, "mpirun's rank to start")
    for pid in launcher.session_members(process.pid):
        os.kill(pid, signal.SIGKILL)
    process.wait()
    # Until the killed rank is reaped, it keeps mpirun's pid taken as its session's id.
    wait_until(lambda: not launcher.session_members(process.pid), 30, "the killed job's processes to go")
    assert list(session.glob("pmix.*")), f"mpirun left nothing in {session}"
    return process.pid


@pytest.mark.skipif(os.geteuid() != 0, reason="choosing the next pid (/proc/sys/kernel/ns_last_pid) needs root")
def test_a_launch_given_the_pid_of_a_killed_mpirun_starts(tmp_path):
    """With the session directory in TMPDIR/ompi.PID, as mpirun has it by default, this launch
    failed with "The PMIx server's listener thread failed to start" (status 213)."""
    stale_pid = killed_mpirun_leftovers(tmp_path)
    for _ in range(10):  # another process on this machine may take the pid first
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(stale_pid - 1))
        result, mpirun_pid, _ = launch({"TMPDIR": str(tmp_path)})
        assert result.returncode == 0, result.stdout
        if mpirun_pid == stale_pid:
            return
    pytest.skip(f"no launch was given the pid {stale_pid} in 10 tries")
