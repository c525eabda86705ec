"""scripts/synthetic_benchmark.py, Horovod's synthetic benchmark, with TensorFlow on 2 real ranks
under mpirun: rank 0 alone reports, in Horovod's lines, a total that is the ranks' throughput
added up."""

import sys
from pathlib import Path

import pytest

from hvdtrain.launch import mpirun

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "synthetic_benchmark.py"


@pytest.fixture(scope="module")
def reported():
    """The lines of Horovod's report that 2 ranks of the benchmark printed."""
    environment = mpirun.worker_environment(2)
    program = [sys.executable, "-u", str(SCRIPT), "--framework", "tensorflow", "--model", "mobilenet_v3_small",
               "--no-cuda", "--batch-size", "2", "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
               "--num-iters", "2"]
    result = mpirun.run(mpirun.mpirun_command(program, num_proc=2, env=environment), env=environment, timeout=240,
                        capture=True)
    assert result.returncode == 0, result.stdout
    return [line for line in result.stdout.splitlines() if line.startswith(("Model", "Number", "Iter", "Img", "Total"))]


def test_rank_0_alone_reports_the_model_and_the_cpus(reported):
    assert reported[:2] == ["Model: mobilenet_v3_small", "Number of CPUs: 2"]


def test_the_report_has_horovods_lines(reported):
    assert [line.split(":")[0] for line in reported[2:]] == [
        "Iter #0", "Iter #1", "Img/sec per CPU", "Total img/sec on 2 CPU(s)"]


def test_the_total_is_the_ranks_throughput_added_up(reported):
    per_cpu, total = (float(line.split(": ")[1].split(" ")[0]) for line in reported[-2:])
    assert per_cpu > 0 and total == pytest.approx(2 * per_cpu, abs=0.11)
