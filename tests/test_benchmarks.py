"""The benchmarks time what they claim: scripts/bench_allreduce.py sets its inputs before every
timed run, compares every result with the exact value and stops the job on a wrong one;
scripts/synthetic_benchmark.py waits for the device's queued work before reading a clock."""

import importlib.util
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

from hvdtrain.launch import mpirun as launcher

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
TIMEOUT = 240


def script_module(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_module():
    return script_module("bench_allreduce")


def ranks_results_are_checked_exactly():
    from hvdtrain import core

    bench = bench_module()
    core.init()
    rank, size = core.rank(), core.size()
    arrays = [("a", np.empty((3, 4), np.float32)), ("b", np.empty((3, 4), np.float32)), ("c", np.empty(7, np.float32))]
    work = bench.workload(arrays, bench.pattern(31))

    def reduce(op):
        for name, array in arrays:
            core.allreduce_async(array, name=name, op=op).wait()

    work.fill(rank)
    reduce(core.ReduceOp.SUM)
    work.check(False, size, rank, "sum")
    assert arrays[2][1].tolist() == [(25 + i) * 3.0 for i in range(7)]  # (offset 24 + i + 1) * (1 + 2)
    # Summing the result again, as a bench that does not reset its inputs would: caught.
    reduce(core.ReduceOp.SUM)
    try:
        work.check(False, size, rank, "sum again")
    except bench.WrongResult as error:
        assert str(error) == (f"sum again: wrong result on rank {rank} in a[0, 0]: 6.0, expected 3.0 "
                              f"(12 of 12 elements wrong)"), error
    else:
        raise AssertionError("a sum of a sum passed the check")
    work.fill(rank)
    reduce(core.ReduceOp.AVERAGE)
    work.check(True, size, rank, "average")
    # Results that landed in another tensor of the same shape: caught.
    arrays[0][1][...], arrays[1][1][...] = arrays[1][1].copy(), arrays[0][1].copy()
    try:
        work.check(True, size, rank, "swapped")
    except bench.WrongResult as error:
        assert str(error).startswith(f"swapped: wrong result on rank {rank} in a[0, 0]: "), error
    else:
        raise AssertionError("swapped tensors passed the check")


def test_results_are_checked_exactly(mpirun):
    mpirun(2, ranks_results_are_checked_exactly, timeout=TIMEOUT)


def ranks_the_bench_stops_on_a_wrong_result(model):
    from mpi4py import MPI

    bench = bench_module()
    rank = MPI.COMM_WORLD.Get_rank()
    correct_pattern = bench.pattern
    # Rank 1's inputs are not what the check expects, as with a reduction that lost a rank's part.
    bench.pattern = lambda elements: correct_pattern(elements) * (1 + rank)
    sys.argv = ["bench_allreduce.py", "--model", model, "--rounds", "1", "--warmup", "0", "--repeats", "1"]
    bench.main()


def test_the_bench_stops_on_a_wrong_result(mpirun):
    result = mpirun(2, ranks_the_bench_stops_on_a_wrong_result, "squeezenet1_1", timeout=TIMEOUT,
                    expect_success=False)
    assert result.returncode != 0, result.stdout
    assert "bench_allreduce: raw MPI Allreduce, flat: wrong result on rank " in result.stdout, result.stdout
    assert "Total" not in result.stdout and "engine, Sum" not in result.stdout, result.stdout


def test_the_bench_runs_and_its_results_pass_the_checks():
    environment = launcher.worker_environment(2)
    program = [sys.executable, "-u", str(SCRIPTS / "bench_allreduce.py"), "--model", "squeezenet1_1",
               "--rounds", "1", "--warmup", "0", "--repeats", "1"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode == 0, result.stdout
    assert "wrong result" not in result.stdout
    assert "squeezenet1_1: 52 tensors" in result.stdout, result.stdout
    assert "(c) engine, Sum, separate, fusion off" in result.stdout, result.stdout


def test_the_synthetic_benchmark_times_the_work_a_step_queued():
    """A step that returns once its work is queued, as a step on a GPU does: its time must count."""
    synthetic = script_module("synthetic_benchmark")
    work = queue.Queue()  # seconds of work, done in order, as a CUDA stream does it

    def device():
        while (seconds := work.get()) is not None:
            time.sleep(seconds)
            work.task_done()

    threading.Thread(target=device, daemon=True).start()
    job = synthetic.Job(rank=0, size=1, device="GPU", step=lambda: work.put(0.1), synchronize=work.join)
    work.put(1.0)  # queued before the timing starts: not the steps' time
    seconds = synthetic.timed_steps(job, 3)
    work.put(None)
    assert 0.3 <= seconds < 0.9, seconds


def test_the_profile_counts_overlapping_device_work_once_over_the_whole_trace():
    """--profile's summary: device work covers [10, 40) and [50, 60) of a trace spanning
    [0, 100) (host events included), so the device was busy 40 % of the time."""
    synthetic = script_module("synthetic_benchmark")

    def event(category, start, end):
        return {"ph": "X", "cat": category, "ts": start, "dur": end - start}

    events = [event("cpu_op", 0, 100), event("kernel", 10, 30), event("kernel", 20, 40), event("gpu_memcpy", 25, 35),
              event("gpu_memset", 50, 60), {"ph": "i", "cat": "kernel", "ts": 70}, event("cuda_runtime", 90, 95)]
    assert synthetic.device_busy_fraction(events) == 0.4
    assert synthetic.device_busy_fraction([event("cpu_op", 0, 100)]) is None


HOROVOD_STYLE_SCRIPT = """
import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
for _ in range(4):
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
print("rank", hvd.rank(), "runs", hvd.__name__)
"""


def test_the_horovod_comparison_runs_horovod_scripts_on_hvdtrain_and_times_its_engine(tmp_path):
    """scripts/bench_horovod.py's shim: `import horovod.torch` is hvdtrain.torch, and every rank
    reports its engine thread's CPU clock after the warm-up steps and at the end."""
    sys.path.insert(0, str(SCRIPTS))  # bench_horovod imports its sibling run_benchmarks
    try:
        bench = script_module("bench_horovod")
    finally:
        sys.path.remove(str(SCRIPTS))
    shim = tmp_path / "shim"
    bench.write_shim(shim)
    script = tmp_path / "horovod_style.py"
    script.write_text(HOROVOD_STYLE_SCRIPT)
    environment = bench.environment("hvdtrain", shim, warmup_steps=2)
    result = launcher.run(launcher.mpirun_command([sys.executable, "-u", str(script)], num_proc=2, env=environment),
                          env=environment, timeout=TIMEOUT, capture=True)
    assert result.returncode == 0, result.stdout
    assert "rank 0 runs hvdtrain.torch" in result.stdout and "rank 1 runs hvdtrain.torch" in result.stdout
    reports = {path.name: [float(seconds) for seconds in path.read_text().split()] for path in shim.glob("engine-cpu.*")}
    assert sorted(reports) == ["engine-cpu.0", "engine-cpu.1"], reports
    assert all(0 < after_warmup <= at_end for after_warmup, at_end in reports.values()), reports


def test_throughput_is_read_from_the_iterations_without_the_totals_rounding():
    sys.path.insert(0, str(SCRIPTS))
    try:
        runs = script_module("run_benchmarks")
    finally:
        sys.path.remove(str(SCRIPTS))
    output = ("Model: resnet50\nIter #0: 3.7 img/sec per CPU\nIter #1: 3.6 img/sec per CPU\n"
              "Iter #2: 3.6 img/sec per CPU\nImg/sec per CPU: 3.6 +-0.1\nTotal img/sec on 2 CPU(s): 7.3 +-0.1\n")
    assert abs(runs.total_images_per_second(output) - 2 * (3.7 + 3.6 + 3.6) / 3) < 1e-12
