"""Run the benchmarks side by side and print the table of docs/benchmarks.md.

    python scripts/run_benchmarks.py [--repeats 5] [--ranks 2] [--out benchmarks.json]

This machine is shared and noisy, so every comparison is a ratio of runs made in turns in
one session:
  - the engine against raw MPI: scripts/bench_allreduce.py, once, with --allreduce-rounds
    rounds of raw MPI then the engine (the ratios are taken within each round);
  - training throughput of hvdtrain.torch against PyTorch DDP (gloo) at --ranks ranks, and
    against the plain single-process loop with the same per-rank share of cores
    (scripts/synthetic_benchmark.py): --repeats rounds of the three runs in turn; a ratio is
    taken within a round and the median over rounds is reported (single runs of the same code
    differ by 10-20 % here, so one pair says little).
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hvdtrain.launch import mpirun as launcher

SCRIPTS = Path(__file__).resolve().parent


def run_ranks(num_proc, argv, timeout=1800):
    env = launcher.worker_environment(num_proc)
    command = launcher.mpirun_command([sys.executable, "-u", *argv], num_proc=num_proc, env=env)
    result = launcher.run(command, env=env, timeout=timeout, capture=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stdout}")
    return result.stdout


def plain_loop(argv, ranks, timeout=1800):
    """One process with the share of cores one of `ranks` ranks gets (every thread variable)."""
    env = launcher.worker_environment(ranks)
    result = subprocess.run([sys.executable, "-u", *argv], env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def total_images_per_second(output):
    """Images a second over all ranks, as the 'Total img/sec' line computes it (the mean of the
    iterations' figures times the ranks) but without its rounding to 0.1, which is 1.4 % of
    ResNet-50's 7.4 img/s on 2 CPU ranks."""
    ranks = int(re.search(r"^Total img/sec on (\d+) \w+\(s\): ", output, re.M).group(1))
    iterations = [float(figure) for figure in re.findall(r"^Iter #\d+: ([\d.]+) img/sec per \w+$", output, re.M)]
    return ranks * statistics.mean(iterations)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the three training runs")
    parser.add_argument("--allreduce-rounds", type=int, default=7)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    synthetic = [str(SCRIPTS / "synthetic_benchmark.py"), "--no-cuda", "--model", args.model,
                 "--batch-size", str(args.batch_size), "--num-warmup-batches", "2",
                 "--num-batches-per-iter", "2", "--num-iters", "5"]
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        run_ranks(args.ranks, [str(SCRIPTS / "bench_allreduce.py"), "--rounds", str(args.allreduce_rounds),
                               "--json", report.name])
        allreduce = json.load(open(report.name))
    print(f"allreduce: raw/engine {allreduce['ratio_best_raw_over_engine']}", flush=True)

    rounds = []
    for round_index in range(args.repeats):
        figures = {
            "hvdtrain_img_s": total_images_per_second(run_ranks(args.ranks, synthetic)),
            "ddp_img_s": total_images_per_second(run_ranks(args.ranks, synthetic + ["--ddp"])),
            "plain_img_s": total_images_per_second(plain_loop(synthetic, args.ranks)),
        }
        rounds.append(figures)
        print(f"round {round_index + 1}: {json.dumps(figures)}", flush=True)

    def median(select):
        return statistics.median(select(r) for r in rounds)

    summary = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "ranks": args.ranks,
        "repeats": args.repeats,
        "allreduce": {k: allreduce[k] for k in ("rounds", "raw_mpi_ms", "raw_mpi_best_ms", "engine_ms",
                                                "ratio_best_raw_over_engine", "ratio_by_round", "negotiation_ms")},
        "synthetic": {
            "model": args.model,
            "per_rank_batch": args.batch_size,
            "hvdtrain_img_s": median(lambda r: r["hvdtrain_img_s"]),
            "ddp_img_s": median(lambda r: r["ddp_img_s"]),
            "plain_img_s": median(lambda r: r["plain_img_s"]),
            "hvdtrain_over_ddp": median(lambda r: r["hvdtrain_img_s"] / r["ddp_img_s"]),
            "hvdtrain_over_ddp_by_round": [round(r["hvdtrain_img_s"] / r["ddp_img_s"], 3) for r in rounds],
            "scaling_efficiency": median(lambda r: r["hvdtrain_img_s"] / (args.ranks * r["plain_img_s"])),
            "ddp_scaling_efficiency": median(lambda r: r["ddp_img_s"] / (args.ranks * r["plain_img_s"])),
        },
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
