"""Training throughput of hvdtrain against Horovod 0.28.1 itself and PyTorch DDP, on this machine.

    sh scripts/build_horovod.sh                      # once: Horovod 0.28.1 in .venv-horovod
    python scripts/bench_horovod.py [--rounds 5] [--models resnet50 resnet18] [--out FILE]
    make bench-horovod                               # both

A round of both models takes about 7 minutes on 2 cores.

Horovod's own examples/pytorch/pytorch_synthetic_benchmark.py of v0.28.1, unchanged (its SHA-256
is checked), trains each model on synthetic data with 2 ranks of one thread each, under:
  - horovod:        Horovod 0.28.1 (.venv-horovod) with Open MPI's defaults;
  - horovod_yield:  the same with OMPI_MCA_mpi_yield_when_idle=1, which hvdtrain's launcher sets;
  - hvdtrain:       the same script with `import horovod.torch` resolving to hvdtrain.torch (a
                    shim package written to a temporary directory first on PYTHONPATH);
  - hvdtrain_per_gradient (only when --variants names it): hvdtrain submitting each gradient on its
                    own (HVDTRAIN_SEGMENT_BYTES=0), as Horovod does, to measure what segments bring;
and PyTorch DDP on gloo runs scripts/synthetic_benchmark.py --ddp with the same flags (ddp).
All four use .venv's torch and Open MPI, started by the same mpirun command (no binding, ranks
mapped by slot). The PyPI sdist has no examples/, so the script is fetched from Horovod's git tag
into build/horovod/ on first use (or put there by hand where GitHub cannot be reached).

This machine is shared and noisy, so each comparison is a ratio within a round: a round runs
every model under the four set-ups, in an order rotated by one each round so that no set-up
always runs first; the median and the range of each ratio over rounds are reported. A run
counts only if it exited 0 and printed every iteration and the final "Total img/sec" line. The
1-minute load average before and after each run is recorded with it.

In the hvdtrain runs each rank also reports the CPU time of hvdtrain's engine thread: read through
the thread's CPU clock after the warm-up's last optimizer step, and by the thread itself as its
loop ends (the shim wraps DistributedOptimizer and Engine._run for that; hvdtrain's code is not
changed). The difference divided by the timed steps is the engine's CPU cost per step in steady
state: the initial broadcasts and the first steps' coordinator rounds are left out.
"""

import argparse
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

from hvdtrain.launch import mpirun as launcher
from run_benchmarks import total_images_per_second

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
HOROVOD_PYTHON = REPO / ".venv-horovod" / "bin" / "python"
HOROVOD_SCRIPT = REPO / "build" / "horovod" / "pytorch_synthetic_benchmark.py"
HOROVOD_SCRIPT_URL = ("https://raw.githubusercontent.com/horovod/horovod/v0.28.1/"
                      "examples/pytorch/pytorch_synthetic_benchmark.py")
HOROVOD_SCRIPT_SHA256 = "020759fa7293888607afa14c39be08aecac5ee9bd07ac63c4fc497b975d6ae88"
RANKS = 2
VARIANTS = ("horovod", "horovod_yield", "hvdtrain", "ddp")
# On request (--variants): hvdtrain submitting each gradient on its own, as before segments.
EXTRA_VARIANTS = ("hvdtrain_per_gradient",)
RATIOS = (("hvdtrain", "horovod"), ("hvdtrain", "horovod_yield"), ("hvdtrain", "ddp"),
          ("hvdtrain", "hvdtrain_per_gradient"))

SHIM_PACKAGE = '"""Horovod\'s name for hvdtrain, for scripts/bench_horovod.py."""\n'
SHIM_TORCH = '''"""hvdtrain.torch under Horovod's name, for scripts/bench_horovod.py: this module replaces
itself by hvdtrain.torch, and each rank writes the CPU time of hvdtrain's engine thread to
engine-cpu.RANK beside this package (not to standard output, where mpirun can interleave it with
another rank's half-written line): when the warm-up's optimizer steps are done and when the thread
ends."""
import os
import sys
import time

import hvdtrain.core
import hvdtrain.torch
from hvdtrain.core.engine import Engine

_engine_loop = Engine._run
_make_optimizer = hvdtrain.torch.DistributedOptimizer
_WARMUP_STEPS = int(os.environ["HVDTRAIN_BENCH_WARMUP_STEPS"])
_REPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       f"engine-cpu.{os.environ.get('OMPI_COMM_WORLD_RANK', '0')}")
_timed_from = []


# Read by the thread itself as its loop ends, however it ends: at this rank's exit, or earlier
# when a peer's exit stops it (then a reading from another thread at exit would find it gone).
def _engine_loop_reporting_cpu_time(engine):
    try:
        _engine_loop(engine)
    finally:
        with open(_REPORT, "w") as report:
            report.write(f"{' '.join(_timed_from) or '-'} {time.thread_time():.4f}\\n")


def _optimizer_noting_the_end_of_warmup(*args, **kwargs):
    optimizer = _make_optimizer(*args, **kwargs)
    step, steps = optimizer.step, []

    def counted_step(*step_args, **step_kwargs):
        result = step(*step_args, **step_kwargs)
        steps.append(None)
        if len(steps) == _WARMUP_STEPS:
            clock = time.pthread_getcpuclockid(hvdtrain.core._engine._thread.ident)
            _timed_from.append(f"{time.clock_gettime(clock):.4f}")
        return result

    optimizer.step = counted_step
    return optimizer


Engine._run = _engine_loop_reporting_cpu_time
hvdtrain.torch.DistributedOptimizer = _optimizer_noting_the_end_of_warmup
sys.modules[__name__] = hvdtrain.torch
'''


@dataclass
class Run:
    """One benchmark run: its throughput over both ranks, and what the machine was doing."""

    img_s: float
    wall_s: float
    load_before: float
    load_after: float
    engine_cpu_s: List[float] = field(default_factory=list)  # per rank, over the whole run; hvdtrain runs only
    engine_ms_per_step: Optional[float] = None


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the four set-ups, for every model")
    parser.add_argument("--models", nargs="+", default=["resnet50", "resnet18"],
                        help="torchvision models (resnet18: less compute per gradient byte than resnet50)")
    parser.add_argument("--batch-size", type=int, default=8, help="images per rank and step")
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS + EXTRA_VARIANTS,
                        help="the set-ups to run (hvdtrain always)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=REPO / "studies" / "horovod_bench" / "results.json",
                        help="where the JSON of every run and the summary is written")
    return parser.parse_args()


def horovod_benchmark_script():
    """Horovod 0.28.1's pytorch_synthetic_benchmark.py, fetched once into build/horovod/."""
    if not HOROVOD_SCRIPT.exists():
        try:
            with urllib.request.urlopen(HOROVOD_SCRIPT_URL, timeout=30) as response:
                text = response.read()
        except OSError as error:
            raise SystemExit(f"cannot download {HOROVOD_SCRIPT_URL} ({error}); put that file there by hand: "
                             f"git -C <a clone of horovod> show v0.28.1:examples/pytorch/pytorch_synthetic_benchmark.py"
                             f" > {HOROVOD_SCRIPT}")
        HOROVOD_SCRIPT.parent.mkdir(parents=True, exist_ok=True)
        HOROVOD_SCRIPT.write_bytes(text)
    digest = hashlib.sha256(HOROVOD_SCRIPT.read_bytes()).hexdigest()
    if digest != HOROVOD_SCRIPT_SHA256:
        raise SystemExit(f"{HOROVOD_SCRIPT} is not Horovod v0.28.1's pytorch_synthetic_benchmark.py "
                         f"(SHA-256 {digest}); delete it to fetch it again")
    return HOROVOD_SCRIPT


def write_shim(directory):
    package = directory / "horovod"
    (package / "torch").mkdir(parents=True)
    (package / "__init__.py").write_text(SHIM_PACKAGE)
    (package / "torch" / "__init__.py").write_text(SHIM_TORCH)


def environment(variant, shim, warmup_steps):
    """The ranks' environment: one thread each, and Open MPI yielding except under Horovod's defaults."""
    base = {name: value for name, value in os.environ.items() if name != "OMPI_MCA_mpi_yield_when_idle"}
    base.update({name: "1" for name in launcher.THREAD_VARIABLES})
    env = launcher.worker_environment(RANKS, base)
    if variant == "horovod":
        del env["OMPI_MCA_mpi_yield_when_idle"]
    if variant == "hvdtrain_per_gradient":
        env["HVDTRAIN_SEGMENT_BYTES"] = "0"
    if variant.startswith("hvdtrain"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), env.get("PYTHONPATH")]))
        env["HVDTRAIN_BENCH_WARMUP_STEPS"] = str(warmup_steps)
    return env


def program(variant, model, args, horovod_script):
    flags = ["--no-cuda", "--model", model, "--batch-size", str(args.batch_size),
             "--num-warmup-batches", str(args.num_warmup_batches),
             "--num-batches-per-iter", str(args.num_batches_per_iter), "--num-iters", str(args.num_iters)]
    if variant == "ddp":
        return [sys.executable, "-u", str(SCRIPTS / "synthetic_benchmark.py"), "--ddp", *flags]
    python = HOROVOD_PYTHON if variant.startswith("horovod") else sys.executable
    return [str(python), "-u", str(horovod_script), *flags]


def output_problems(output, returncode, model, args):
    """What shows that a run did not train as asked (empty when it did)."""
    problems = [] if returncode == 0 else [f"exit status {returncode}"]
    if f"Model: {model}\n" not in output:
        problems.append(f"no 'Model: {model}' line")
    if f"Number of CPUs: {RANKS}\n" not in output:
        problems.append(f"no 'Number of CPUs: {RANKS}' line")
    iterations = len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per CPU$", output, re.M))
    if iterations != args.num_iters:
        problems.append(f"{iterations} of {args.num_iters} iterations")
    if not re.search(rf"^Total img/sec on {RANKS} CPU\(s\): [\d.]+ ", output, re.M):
        problems.append("no 'Total img/sec' line")
    return problems


def run(variant, model, args, horovod_script, shim):
    env = environment(variant, shim, args.num_warmup_batches)
    command = launcher.mpirun_command(program(variant, model, args, horovod_script), num_proc=RANKS, env=env)
    load_before = round(os.getloadavg()[0], 2)
    started = time.monotonic()
    try:
        result = launcher.run(command, env=env, timeout=args.timeout, capture=True)
    except subprocess.TimeoutExpired as error:
        raise SystemExit(f"{variant} {model}: no result within {args.timeout:.0f} s:\n{error.output}")
    wall_s = time.monotonic() - started
    output = result.stdout
    problems = output_problems(output, result.returncode, model, args)
    report_paths = sorted(shim.glob("engine-cpu.*"))
    reports = [path.read_text().split() for path in report_paths]
    for path in report_paths:
        path.unlink()
    timed = [(float(start), float(end)) for start, end in reports if start != "-"]
    if variant.startswith("hvdtrain") and len(timed) != RANKS:
        problems.append(f"the engine's CPU time over the timed steps from {len(timed)} of {RANKS} ranks")
    if problems:
        raise SystemExit(f"{variant} {model} failed ({'; '.join(problems)}): {' '.join(command)}\n{output}")
    timed_steps = args.num_iters * args.num_batches_per_iter
    return Run(img_s=total_images_per_second(output), wall_s=round(wall_s, 1), load_before=load_before,
               load_after=round(os.getloadavg()[0], 2), engine_cpu_s=[end for _, end in timed],
               engine_ms_per_step=round(1000 * statistics.mean(end - start for start, end in timed) / timed_steps, 3)
               if timed else None)


def ratio(runs, numerator, denominator):
    return runs[numerator].img_s / runs[denominator].img_s


def ratios_of(variants):
    return [(n, d) for n, d in RATIOS if n in variants and d in variants]


def summarize(rounds, models, variants):
    """Per model: the median img/s of each set-up, and each ratio's median, range and rounds."""
    summary = {}
    for model in models:
        runs = [r["runs"][model] for r in rounds]
        summary[model] = {
            "img_s_median": {v: statistics.median(r[v].img_s for r in runs) for v in variants},
            "engine_ms_per_step_median": {v: statistics.median(r[v].engine_ms_per_step for r in runs)
                                          for v in variants if v.startswith("hvdtrain")},
        }
        for numerator, denominator in ratios_of(variants):
            by_round = [ratio(r, numerator, denominator) for r in runs]
            summary[model][f"{numerator}_over_{denominator}"] = {
                "median": round(statistics.median(by_round), 3), "min": round(min(by_round), 3),
                "max": round(max(by_round), 3), "by_round": [round(x, 3) for x in by_round]}
    return summary


def print_table(rounds, summary, args):
    variants, ratios = args.variants, ratios_of(args.variants)
    ratio_names = [f"{n}/{d}" for n, d in ratios]
    engines = [v for v in variants if v.startswith("hvdtrain")]
    header = ["round", *variants, *ratio_names, *(f"{v} engine ms/step" for v in engines)]
    widths = [max(8, len(name)) for name in header]

    def line(cells):
        print("  ".join(str(cell).rjust(width) for cell, width in zip(cells, widths)))

    for model, figures in summary.items():
        print(f"\n{model}: img/s over {RANKS} ranks x 1 thread, batch {args.batch_size} per rank")
        line(header)
        for r in rounds:
            runs = r["runs"][model]
            line([r["round"], *(f"{runs[v].img_s:.1f}" for v in variants),
                  *(f"{ratio(runs, n, d):.3f}" for n, d in ratios), *(runs[v].engine_ms_per_step for v in engines)])
        medians = figures["img_s_median"]
        line(["median", *(f"{medians[v]:.1f}" for v in variants),
              *(f"{figures[f'{n}_over_{d}']['median']:.3f}" for n, d in ratios),
              *(figures["engine_ms_per_step_median"][v] for v in engines)])
        line(["min-max", *([""] * len(variants)),
              *(f"{figures[f'{n}_over_{d}']['min']:.2f}-{figures[f'{n}_over_{d}']['max']:.2f}" for n, d in ratios)])


def main():
    args = parse_args()
    if not HOROVOD_PYTHON.exists():
        raise SystemExit(f"{HOROVOD_PYTHON} is missing: run sh scripts/build_horovod.sh first")
    horovod_script = horovod_benchmark_script()
    variants = tuple(dict.fromkeys(["hvdtrain", *args.variants]))
    args.variants = variants
    rounds = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-horovod-shim-") as shim:
        write_shim(Path(shim))
        for index in range(args.rounds):
            order = variants[index % len(variants):] + variants[:index % len(variants)]
            runs = {}
            for model in args.models:
                runs[model] = {}
                for variant in order:
                    runs[model][variant] = run(variant, model, args, horovod_script, Path(shim))
                    figures = runs[model][variant]
                    print(f"round {index + 1} {model} {variant}: {figures.img_s:.1f} img/s in {figures.wall_s:.0f} s "
                          f"(load {figures.load_before:.2f} -> {figures.load_after:.2f})", flush=True)
            rounds.append({"round": index + 1, "order": list(order), "runs": runs})

    summary = summarize(rounds, args.models, variants)
    print_table(rounds, summary, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {name: getattr(args, name) for name in ("batch_size", "num_warmup_batches", "num_batches_per_iter",
                                                       "num_iters")}
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "ranks": RANKS, "threads_per_rank": 1, "horovod_script": HOROVOD_SCRIPT_URL, "settings": settings,
        "summary": summary,
        "rounds": [{**r, "runs": {model: {variant: asdict(figures) for variant, figures in runs.items()}
                                  for model, runs in r["runs"].items()}} for r in rounds],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
