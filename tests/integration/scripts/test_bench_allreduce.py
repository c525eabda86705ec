"""scripts/bench_allreduce.py times what it claims: it sets its inputs before every timed run,
compares every result with the exact value and stops the job on a wrong one; on two real ranks."""

import sys

import numpy as np

from hvdtrain.launch import mpirun as launcher

from support.scripts import SCRIPTS, load_script

SCRIPT = SCRIPTS / "bench_allreduce.py"
TIMEOUT = 240


def results_are_checked_exactly():
    from hvdtrain import core

    bench = load_script("bench_allreduce")
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
    mpirun(2, results_are_checked_exactly, timeout=TIMEOUT)


def the_bench_with_a_wrong_input_on_rank_1(model):
    from mpi4py import MPI

    bench = load_script("bench_allreduce")
    rank = MPI.COMM_WORLD.Get_rank()
    correct_pattern = bench.pattern
    # Rank 1's inputs are not what the check expects, as with a reduction that lost a rank's part.
    bench.pattern = lambda elements: correct_pattern(elements) * (1 + rank)
    sys.argv = ["bench_allreduce.py", "--model", model, "--rounds", "1", "--warmup", "0", "--repeats", "1"]
    bench.main()


def test_the_bench_stops_on_a_wrong_result(mpirun):
    result = mpirun(2, the_bench_with_a_wrong_input_on_rank_1, "squeezenet1_1", timeout=TIMEOUT,
                    expect_success=False)
    assert result.returncode != 0, result.stdout
    assert "bench_allreduce: raw MPI Allreduce, flat: wrong result on rank " in result.stdout, result.stdout
    assert "Total" not in result.stdout and "engine, Sum" not in result.stdout, result.stdout


def test_the_bench_runs_and_its_results_pass_the_checks():
    environment = launcher.worker_environment(2)
    program = [sys.executable, "-u", str(SCRIPT), "--model", "squeezenet1_1", "--rounds", "1", "--warmup", "0",
               "--repeats", "1"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode == 0, result.stdout
    assert "wrong result" not in result.stdout
    assert "squeezenet1_1: 52 tensors" in result.stdout, result.stdout
    assert "(c) engine, Sum, separate, fusion off" in result.stdout, result.stdout
