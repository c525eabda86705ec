"""scripts/bench_round_trip.py times one small allreduce's round trip, raw and through the engine,
on real ranks, stops the job on a wrong result, and runs under py-spy, whose samples
scripts/py_spy_summary.py sums by thread."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from hvdtrain.launch import mpirun as launcher

from support.devices import FAKE_CUPY
from support.scripts import SCRIPTS, load_script

SCRIPT = SCRIPTS / "bench_round_trip.py"
TIMEOUT = 120


def test_two_ranks_time_the_raw_call_and_the_engine_on_checked_results():
    environment = launcher.worker_environment(2)
    program = [sys.executable, "-u", str(SCRIPT), "--rounds", "2", "--count", "20"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode == 0, result.stdout
    report = json.loads(result.stdout.splitlines()[-1])
    assert (report["device"], report["ranks"], report["elements"], report["rounds"]) == ("cpu", 2, 1024, 2)
    assert report["raw_us"] > 0 and report["engine_us"] > 0


def test_the_gpu_path_runs_on_the_stand_in_cupy_at_two_ranks():
    """--device cuda: CuPy's stream, array and NCCL calls of the script, on the stand-in whose device
    memory is host memory and whose NCCL moves the bytes with MPI (what a GPU session runs first)."""
    environment = launcher.worker_environment(2, {**os.environ,
                                                  "PYTHONPATH": os.pathsep.join(filter(None, [
                                                      FAKE_CUPY, os.environ.get("PYTHONPATH")]))})
    program = [sys.executable, "-u", str(SCRIPT), "--device", "cuda", "--rounds", "1", "--count", "20"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode == 0, result.stdout
    report = json.loads(result.stdout.splitlines()[-1])
    assert (report["device"], report["ranks"]) == ("cuda", 2)


def the_bench_whose_engine_loses_the_other_ranks_part():
    bench = load_script("bench_round_trip")
    correct_transport = bench.transport

    def transport(device, elements):  # the array keeps this rank's own part
        return dataclasses.replace(correct_transport(device, elements), engine=lambda: None)

    bench.transport = transport
    sys.argv = ["bench_round_trip.py", "--rounds", "1", "--count", "3"]
    bench.main()


def test_a_wrong_result_stops_the_job_naming_the_rank(mpirun):
    result = mpirun(2, the_bench_whose_engine_loses_the_other_ranks_part, timeout=TIMEOUT, expect_success=False)
    assert result.returncode != 0, result.stdout
    assert "bench_round_trip: engine: wrong result on rank " in result.stdout, result.stdout
    assert "at element 0: " in result.stdout and "expected 3.0" in result.stdout, result.stdout
    assert "extra_us" not in result.stdout


def test_py_spy_samples_the_round_trip_and_the_summary_shows_both_threads(tmp_path):
    profile = tmp_path / "round_trip.raw"
    py_spy = Path(sys.executable).parent / "py-spy"  # the dev extra's, beside the tests' Python
    recorded = subprocess.run([str(py_spy), "record", "--idle", "--threads", "--nonblocking", "--rate", "500",
                               "--format", "raw", "-o", str(profile), "--", sys.executable, str(SCRIPT),
                               "--rounds", "1", "--count", "2000"], capture_output=True, text=True, timeout=TIMEOUT)
    assert '"extra_us"' in recorded.stdout, recorded.stdout + recorded.stderr
    summary = subprocess.run([sys.executable, str(SCRIPTS / "py_spy_summary.py"), str(profile), "--within",
                              "median_round_trip"], capture_output=True, text=True, timeout=TIMEOUT)
    assert summary.returncode == 0, summary.stderr
    assert "## MainThread: " in summary.stdout and "## hvdtrain-engine: " in summary.stdout, summary.stdout
    assert "Handle.wait (hvdtrain/core/requests.py)" in summary.stdout, summary.stdout
