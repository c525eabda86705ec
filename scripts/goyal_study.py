"""Goyal et al.'s linear scaling rule and warmup on MNIST-1D, and LARS where the rule breaks.

    python scripts/goyal_study.py [--batches 32,64,...,8192] [--seeds 0,1] [--out studies/goyal_mnist1d]

The study uses the product as a user would: each point is a run of `hvdtrain -m` (a Hydra
multirun) of the recipes goyal_mnist1d and goyal_mnist1d_lars on 2 local ranks:
  1. the reference, the smallest global minibatch kn (k = 1: the base LR is its LR, so the three
     warmups coincide there and it runs once per seed);
  2. momentum SGD at every larger kn, the LR by the linear rule, with no, constant and gradual
     warmup (Goyal section 2.2), each seed;
  3. LARS with gradual warmup from the largest kn at which the rule still holds (the gradual
     warmup's mean validation error within --tolerance points of the reference's, at that kn and
     every smaller one) up to the largest kn.
Then it collects every run's config.yaml, results.json and metrics.jsonl into OUT/results.csv
(one row per run, with the peak LR the run trained at), OUT/summary.md (the table of mean
validation errors and where the rule holds) and two figures: OUT/val_error_vs_kn.png
(Goyal's Table 2 and Figure 1) and OUT/training_curves.png (their Figures 2 and 4).
"""

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from hvdtrain.reporting.run_log import read_history

REFERENCE, WARMUPS, RANKS = "reference", ("none", "constant", "gradual"), 2
COLUMNS = ("optimizer", "warmup", "kn", "seed", "per_rank_batch", "base_lr", "base_batch_size", "peak_lr",
           "epochs", "steps_per_epoch", "val_error", "val_loss", "final_train_loss", "train_time_s", "run_dir")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default=",".join(str(2**n) for n in range(5, 14)),
                        help="global minibatches kn, the smallest the reference (default 32,...,8192)")
    parser.add_argument("--seeds", default="0,1", help="train.seed values, each point run once per seed")
    parser.add_argument("--tolerance", type=float, default=0.5,
                        help="the rule holds where the error is within this many points of the reference's")
    parser.add_argument("--out", type=Path, default=Path("studies/goyal_mnist1d"))
    parser.add_argument("--sweeps", type=Path, help="where the runs go (default runs/goyal_study/<time>)")
    parser.add_argument("--replot", action="store_true",
                        help="train nothing: make the table and figures again from the runs in --sweeps")
    parser.add_argument("overrides", nargs="*", help="more hvdtrain overrides for every run (e.g. train.epochs=1)")
    args = parser.parse_args()
    batches = sorted(int(kn) for kn in args.batches.split(","))
    seeds = args.seeds.split(",")
    for kn in batches:
        if kn % RANKS:
            raise SystemExit(f"goyal_study: --batches: {kn} is not a multiple of the {RANKS} ranks")
    if args.replot and not args.sweeps:
        raise SystemExit("goyal_study: --replot needs --sweeps, the directory of the runs to plot")
    sweeps = args.sweeps or Path("runs/goyal_study") / time.strftime("%Y-%m-%d_%H-%M-%S")
    began = time.time()
    common = [f"optimizer.base_batch_size={batches[0]}", f"train.seed={','.join(seeds)}", *args.overrides]
    train = (lambda *run: None) if args.replot else multirun

    train(sweeps / "reference", "goyal_mnist1d", [batches[0]], common)
    if len(batches) > 1:
        train(sweeps / "sgd", "goyal_mnist1d", batches[1:], [f"schedule.warmup={','.join(WARMUPS)}", *common])
    rows = collect(sweeps / "reference", REFERENCE) + collect(sweeps / "sgd")
    holds_to = largest_kn_that_holds(rows, batches, args.tolerance)
    train(sweeps / "lars", "goyal_mnist1d_lars", [kn for kn in batches if kn >= holds_to], common)
    rows += collect(sweeps / "lars")

    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "results.csv", rows)
    (args.out / "summary.md").write_text(summary(rows, batches, holds_to, args.tolerance))
    plot_errors(args.out / "val_error_vs_kn.png", rows, args.tolerance)
    plot_curves(args.out / "training_curves.png", rows, batches, holds_to)
    print((args.out / "summary.md").read_text())
    print(f"goyal_study: {len(rows)} runs in {(time.time() - began) / 60:.1f} minutes; results in {args.out}/ "
          f"(runs in {sweeps}/)")


def multirun(sweep_dir, recipe, batches, overrides):
    """One `hvdtrain -m` over the global minibatches `batches`; its output goes to a log beside the runs."""
    command = [sys.executable, "-m", "hvdtrain.launch.cli", "-m", f"recipe={recipe}",
               f"train.batch_size={','.join(str(kn // RANKS) for kn in batches)}",
               f"hydra.sweep.dir={sweep_dir}", *overrides]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log = sweep_dir / "hvdtrain.log"
    print(f"goyal_study: {recipe} at kn = {', '.join(map(str, batches))} ({log})", flush=True)
    with open(log, "w") as output:
        result = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise SystemExit(f"goyal_study: `{' '.join(command[3:])}` failed (exit status {result.returncode}); "
                         f"its output: {log}")


def collect(sweep_dir, warmup=None):
    """A row per run of a sweep; `warmup` names the reference runs' (for them every warmup is one)."""
    rows = []
    for run_dir in sorted(path for path in sweep_dir.iterdir() if (path / "results.json").is_file()):
        cfg = OmegaConf.load(run_dir / "config.yaml")
        results = json.loads((run_dir / "results.json").read_text())
        train = [record for record in read_history(run_dir / "metrics.jsonl") if record["event"] == "train"]
        rows.append({
            "optimizer": cfg.optimizer.name, "warmup": warmup or cfg.schedule.warmup,
            "kn": results["global_batch_size"], "seed": cfg.train.seed, "per_rank_batch": cfg.train.batch_size,
            "base_lr": cfg.optimizer.base_lr, "base_batch_size": cfg.optimizer.base_batch_size,
            "peak_lr": results["peak_lr"], "epochs": results["epochs_completed"],
            "steps_per_epoch": train[-1]["step"] // results["epochs_completed"],
            "val_error": 100.0 - results["metrics"]["val_top1"], "val_loss": results["metrics"]["val_loss"],
            "final_train_loss": train[-1]["loss"], "train_time_s": results["train_time_s"], "run_dir": str(run_dir),
            "curve": [(record["epoch"], record["loss"]) for record in train],
        })
    return rows


def mean_errors(rows):
    """{(optimizer, warmup, kn): (mean validation error, its spread over the seeds)}"""
    groups = {}
    for row in rows:
        groups.setdefault((row["optimizer"], row["warmup"], row["kn"]), []).append(row["val_error"])
    return {key: (statistics.mean(errors), statistics.pstdev(errors)) for key, errors in groups.items()}


def largest_kn_that_holds(rows, batches, tolerance):
    """The largest kn up to which every kn's error with gradual warmup is within `tolerance`
    points of the reference's (the reference's own kn at least)."""
    errors = mean_errors(rows)
    reference = errors[("sgd", REFERENCE, batches[0])][0]
    holds_to = batches[0]
    for kn in batches[1:]:
        if errors[("sgd", "gradual", kn)][0] > reference + tolerance:
            break
        holds_to = kn
    return holds_to


def write_csv(path, rows):
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def series(rows):
    """The study's lines: (label, optimizer, warmup) in the order of the figures and the table."""
    return [(f"SGD, {warmup} warmup", "sgd", warmup) for warmup in WARMUPS] + [("LARS, gradual warmup", "lars", "gradual")]


def summary(rows, batches, holds_to, tolerance):
    errors = mean_errors(rows)
    reference, spread = errors[("sgd", REFERENCE, batches[0])]
    lines = [f"Validation error (%), mean ± spread over seeds; reference kn = {batches[0]}: {reference:.2f} ± {spread:.2f}.",
             f"The linear rule holds (gradual warmup within {tolerance:g} points of the reference) up to kn = {holds_to}.",
             "", "| kn | " + " | ".join(label for label, _, _ in series(rows)) + " |",
             "|---:|" + "---:|" * len(series(rows))]
    for kn in batches[1:]:
        cells = [f"{errors[(opt, warmup, kn)][0]:.2f} ± {errors[(opt, warmup, kn)][1]:.2f}"
                 if (opt, warmup, kn) in errors else "" for _, opt, warmup in series(rows)]
        lines.append(f"| {kn} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_errors(path, rows, tolerance):
    plt = pyplot()
    errors = mean_errors(rows)
    reference_kn = min(kn for (_, warmup, kn) in errors if warmup == REFERENCE)
    reference = errors[("sgd", REFERENCE, reference_kn)][0]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, optimizer, warmup in series(rows):
        points = sorted((kn, *values) for (opt, w, kn), values in errors.items() if (opt, w) == (optimizer, warmup))
        if points:
            kns, means, spreads = zip(*points)
            axes.errorbar(kns, means, yerr=spreads, marker="o", capsize=3, label=label)
    axes.axhspan(reference - tolerance, reference + tolerance, color="grey", alpha=0.2,
                 label=f"reference kn = {reference_kn} ± {tolerance:g}")
    axes.set(xscale="log", yscale="log", xlabel="global minibatch kn", ylabel="validation error (%)",
             title="MNIST-1D CNN, 2 ranks: the linear scaling rule (Goyal et al. 2017)")
    axes.set_xscale("log", base=2)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def largest_kn_that_trains(rows, batches):
    """The largest kn at which SGD with gradual warmup still learns (mean error below 50 %):
    where the warmups differ most (Goyal's Figure 4 compares them at their largest kn)."""
    errors = mean_errors(rows)
    trained = [kn for kn in batches[1:] if errors[("sgd", "gradual", kn)][0] < 50]
    return max(trained, default=batches[-1])


def plot_curves(path, rows, batches, holds_to):
    """Left: the reference against the largest kn that holds (Goyal's Figure 2); right: the
    variants, LARS beside them, at the largest kn where gradual warmup still learns (their
    Figure 4). Seed 0's curves."""
    plt = pyplot()
    first_seed = min(row["seed"] for row in rows)
    curves = {(row["optimizer"], row["warmup"], row["kn"]): row["curve"] for row in rows if row["seed"] == first_seed}
    compared = largest_kn_that_trains(rows, batches)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    panels = [(left, [(f"kn = {batches[0]} (reference)", ("sgd", REFERENCE, batches[0])),
                      (f"kn = {holds_to}, gradual warmup", ("sgd", "gradual", holds_to))]),
              (right, [(f"kn = {compared}, {label}", (optimizer, warmup, compared))
                       for label, optimizer, warmup in series(rows)])]
    for axes, lines in panels:
        for label, key in lines:
            if key in curves:
                epochs, losses = zip(*curves[key])
                axes.plot(epochs, losses, label=label)
        axes.set(xlabel="epochs", yscale="log")
        axes.legend()
    left.set(ylabel="training loss", title="the largest kn that matches the reference")
    right.set(title="the largest kn at which gradual warmup still learns")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


if __name__ == "__main__":
    main()
