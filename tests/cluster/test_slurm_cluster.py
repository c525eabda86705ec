"""The Slurm cluster of slurm_cluster.py does what a real one does: batch jobs, salloc, srun, Open
MPI's mpirun inside an allocation, srun's direct launch of MPI ranks over PMIx, signals and
requeues, and it leaves nothing behind.

One cluster, the session's `slurm` fixture (conftest.py), serves all tests but the last, which
makes its own.
"""

import glob
import os
import subprocess
import sys
import textwrap

import pytest

from support.commands import processes_mentioning, wait_until
from slurm_cluster import missing_requirements, slurm_cluster

PYTHON = sys.executable
MPIRUN = os.path.join(os.path.dirname(PYTHON), "mpirun")
# The command line of the job's sleep, as /proc holds it: a duration unlikely to be slept by any
# other process of the machine (the test looks for it among them all).
SLEEP = "sleep\x00297"
# Each rank adds rank + 1: with 2 ranks every rank prints 3.
ALLREDUCE = textwrap.dedent("""\
    import socket
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    print("rank", world.Get_rank(), "of", world.Get_size(), "on", socket.gethostname(), "sum",
          world.allreduce(world.Get_rank() + 1), flush=True)
""")


@pytest.fixture(scope="module")
def allreduce(slurm):
    """The path of ALLREDUCE, where every node finds it."""
    path = slurm.work_dir / "allreduce.py"
    path.write_text(ALLREDUCE)
    return path


def require_mpi():
    if not os.path.exists(MPIRUN):
        pytest.skip(f"Open MPI's mpirun is not next to {PYTHON}")
    pytest.importorskip("mpi4py")


def ranks_by_host(output):
    """{hostname: sum} from the lines that ALLREDUCE printed, which must be 2 ranks."""
    lines = [line.split() for line in output.splitlines() if line.startswith("rank ")]
    assert sorted(int(words[1]) for words in lines) == [0, 1] and all(words[3] == "2" for words in lines), output
    return {words[5]: int(words[7]) for words in lines}


def test_batch_job_runs_srun_on_both_nodes_whose_names_resolve(slurm):
    job = slurm.submit(f"""#!/bin/sh
srun {PYTHON} -c 'import socket; name = socket.gethostname(); print(name, socket.gethostbyname(name))'
""", "--nodes=2", "--ntasks-per-node=1")
    fields = slurm.wait_for_job_state(job, "COMPLETED", "FAILED", "CANCELLED", timeout=30)
    assert fields["JobState"] == "COMPLETED", slurm.output(job)
    printed = sorted(tuple(line.split()) for line in slurm.output(job).splitlines())
    assert printed == sorted((node.name, node.address) for node in slurm.nodes)


def test_salloc_command_sees_both_nodes(slurm):
    result = slurm.run("salloc", "--nodes=2", "--ntasks-per-node=1",
                       "sh", "-c", 'scontrol show hostnames "$SLURM_JOB_NODELIST"', timeout=30)
    assert [line for line in result.stdout.splitlines() if not line.startswith("salloc:")] == slurm.node_names


def test_mpirun_in_a_batch_job_runs_one_rank_on_each_node(slurm, allreduce):
    # mpirun finds the allocation (its ras/slurm component) and starts its daemon on the other
    # node with srun (plm/slurm). Without --bind-to none both ranks would be bound to core 0 of
    # their "node", the same core of this machine.
    require_mpi()
    job = slurm.submit(f"""#!/bin/sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{MPIRUN} -np 2 --bind-to none {PYTHON} {allreduce}
""", "--nodes=2", "--ntasks-per-node=1")
    fields = slurm.wait_for_job_state(job, "COMPLETED", "FAILED", "CANCELLED", timeout=60)
    assert fields["JobState"] == "COMPLETED", slurm.output(job)
    assert ranks_by_host(slurm.output(job)) == {name: 3 for name in slurm.node_names}


def test_srun_starts_mpi_ranks_itself_over_pmix(slurm, allreduce):
    # Slurm's mpi/pmix plugin loads libpmix.so, which Debian ships in libpmix-dev; srun fails
    # with "can not load PMIx library" without it.
    require_mpi()
    if not glob.glob("/usr/lib/*/pmix2/lib/libpmix.so"):
        pytest.skip("srun --mpi=pmix needs libpmix-dev: run scripts/install_test_packages.sh as root")
    result = slurm.run("srun", "--nodes=2", "--ntasks-per-node=1", "--mpi=pmix",
                       PYTHON, str(allreduce), timeout=60)
    assert ranks_by_host(result.stdout) == {name: 3 for name in slurm.node_names}


def test_scancel_signals_the_batch_shell(slurm):
    job = slurm.submit("""#!/bin/sh
trap 'echo got USR1; exit 0' USR1
echo started
while :; do sleep 0.1; done
""", "--nodes=2", "--ntasks-per-node=1")
    slurm.wait_for_job_state(job, "RUNNING", timeout=30)
    wait_for_output(slurm, job, "started")
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    fields = slurm.wait_for_job_state(job, "COMPLETED", "FAILED", "CANCELLED", timeout=30)
    assert fields["JobState"] == "COMPLETED" and "got USR1" in slurm.output(job), slurm.output(job)


def test_requeued_job_runs_again_with_the_same_id_and_a_restart_count(slurm):
    # --open-mode=append: by default the run after a requeue truncates the output file.
    job = slurm.submit("""#!/bin/sh
echo "run of job $SLURM_JOB_ID, restart count ${SLURM_RESTART_COUNT:-none}"
[ -n "$SLURM_RESTART_COUNT" ] || exec sleep 300
""", "--nodes=2", "--ntasks-per-node=1", "--requeue", "--open-mode=append")
    slurm.wait_for_job_state(job, "RUNNING", timeout=30)
    wait_for_output(slurm, job, "restart count none")
    slurm.run("scontrol", "requeue", job)
    fields = slurm.wait_for_job_state(job, "COMPLETED", "FAILED", "CANCELLED", timeout=60)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1"
    # Between the runs slurmstepd writes "*** JOB ... CANCELLED ... DUE TO JOB REQUEUE ***".
    runs = [line for line in slurm.output(job).splitlines() if line.startswith("run of job")]
    assert runs == [f"run of job {job}, restart count none", f"run of job {job}, restart count 1"]


def test_cluster_leaves_nothing_behind_on_an_error(tmp_path):
    if missing_requirements():
        pytest.skip(f"the Slurm cluster tests are skipped: {missing_requirements()}")
    with pytest.raises(KeyboardInterrupt):
        with slurm_cluster(tmp_path, node_count=1) as cluster:
            job = cluster.submit("#!/bin/sh\nsrun sleep 297\n")
            cluster.wait_for_job_state(job, "RUNNING", timeout=30)
            wait_until(lambda: processes_mentioning(SLEEP), 30, "the job's sleep to start")
            raise KeyboardInterrupt  # as a Ctrl-C in the block
    assert processes_mentioning(str(tmp_path)) == [] and processes_mentioning(SLEEP) == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert cluster.nodes[0].namespace not in namespaces
    with open("/proc/self/mountinfo") as mounts:
        assert str(tmp_path) not in mounts.read()


def wait_for_output(cluster, job, text, timeout=30):
    wait_until(lambda: text in cluster.output(job), timeout, f"job {job} to print {text!r}")
