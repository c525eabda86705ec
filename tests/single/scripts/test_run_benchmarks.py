"""scripts/run_benchmarks.py reads a benchmark's throughput from its iterations, in this process,
not from the rounded total."""

from support.scripts import load_script


def test_throughput_is_read_from_the_iterations_without_the_totals_rounding():
    runs = load_script("run_benchmarks")
    output = ("Model: resnet50\nIter #0: 3.7 img/sec per CPU\nIter #1: 3.6 img/sec per CPU\n"
              "Iter #2: 3.6 img/sec per CPU\nImg/sec per CPU: 3.6 +-0.1\nTotal img/sec on 2 CPU(s): 7.3 +-0.1\n")
    assert abs(runs.total_images_per_second(output) - 2 * (3.7 + 3.6 + 3.6) / 3) < 1e-12
