"""Horovod's published scaling against the scaling model's prediction (issue 18).

    python scripts/horovod_curve.py [--out studies/horovod_scaling] [--gpus 4,8,...,512]

Horovod's benchmark (its README and docs/benchmarks.rst since 2018-05-10; Sergeev and Del
Balso 2018, arXiv:1802.05799) trained ResNet-101, Inception V3 and VGG-16 with
tf_cnn_benchmarks, 64 images per GPU, on servers of 4 Pascal GPUs joined by RoCE-capable
25 Gbit/s Ethernet. The model is asked what `hvdtrain` itself predicts: one sweep
`hvdtrain -m recipe=... cluster=1x4,...,128x4 cluster.network.gbps=25 train.device=cuda
dry_run=true`, so that each point here is what a dry run of that layout prints. Its inputs,
each with its source in the recipe or the config's defaults: one GPU's throughput as Horovod
measured it on that hardware (recipe.reference_throughput of the *_synthetic recipes), the
models' parameter tensors (torchvision's), the link between hosts (25 Gbit/s, NCCL's 6.6 us a
ring step), PCIe 3.0 x16 within a server, backward 2/3 of a step, and hvdtrain's defaults (128
MiB fusion threshold, 1 ms cycle, 25 MiB gradient segments; HOROVOD_FUSION_THRESHOLD,
HOROVOD_CYCLE_TIME and HVDTRAIN_SEGMENT_BYTES are not passed on).
Nothing is fitted. Writes efficiency.csv and efficiency.png to --out and prints the errors where
Horovod published a figure (16, 128 and 512 GPUs).
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hvdtrain.run.plan import read_plans

REPO = Path(__file__).resolve().parent.parent
GPUS_PER_SERVER = 4
GPUS = tuple(GPUS_PER_SERVER * 2 ** k for k in range(8))  # 4 ... 512
NETWORK_GBPS = 25  # "RoCE-capable 25 Gbit/s network"
RECIPES = {"resnet101": "resnet101_synthetic", "inception_v3": "inception3_synthetic", "vgg16": "vgg16_synthetic"}
LABELS = {"resnet101": "ResNet-101", "inception_v3": "Inception V3", "vgg16": "VGG-16"}
MARKERS = ("o", "x", "^")  # ResNet-101's and Inception V3's published points coincide at 128 and 512

# Scaling efficiency against one GPU, as Horovod published it for that hardware:
# - 512 GPUs (128 servers): "Horovod achieves 90% scaling efficiency for both Inception V3 and
#   ResNet-101, and 68% scaling efficiency for VGG-16" (Horovod's README from commit 8318a898,
#   2018-05-10, "Upgrade scaling efficiency chart to 512 GPUs"; docs/benchmarks.rst to this day).
# - 128 GPUs (32 servers), the chart before it, with the Horovod of October 2017: 90 %, 90 %
#   and 79 % (the README from commit 6bb6a2db, 2017-10-17). The paper's own figures reach 128
#   GPUs too, over TCP: 88 % for Inception V3 and ResNet-101.
# - 16 GPUs (4 servers), the table before that chart, "RDMA Horovod (allreduce on GPU with
#   NCCL)" after Tensor Fusion (README from commit d54e3a88, 2017-09-05): 2,022.6, 1,746.2 and
#   1,787.4 images/s against its single-GPU baselines of 134.4, 119.4 and 130.9 (the recipes'
#   reference throughputs).
PUBLISHED = {
    (512, "resnet101"): 0.90, (512, "inception_v3"): 0.90, (512, "vgg16"): 0.68,
    (128, "resnet101"): 0.90, (128, "inception_v3"): 0.90, (128, "vgg16"): 0.79,
    (16, "resnet101"): 1746.2 / (16 * 119.4), (16, "inception_v3"): 2022.6 / (16 * 134.4),
    (16, "vgg16"): 1787.4 / (16 * 130.9),
}
ENGINE_VARIABLES = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HVDTRAIN_SEGMENT_BYTES")


def predicted(gpu_counts):
    """{(gpus, model): the efficiency `hvdtrain ... dry_run=true` predicts}, from one sweep run
    in an empty directory (so that no profile of this machine's stands in for the P100)."""
    layouts = [f"{gpus // GPUS_PER_SERVER}x{GPUS_PER_SERVER}" for gpus in gpu_counts]
    command = [sys.executable, "-m", "hvdtrain.launch.cli", "-m", f"recipe={','.join(RECIPES.values())}",
               f"cluster={','.join(layouts)}", f"cluster.network.gbps={NETWORK_GBPS}", "train.device=cuda",
               "dry_run=true"]
    environment = {name: value for name, value in os.environ.items() if name not in ENGINE_VARIABLES}
    with tempfile.TemporaryDirectory() as empty:
        result = subprocess.run(command, cwd=empty, env=environment, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    plans = read_plans(result.stdout)
    jobs = [(gpus, model) for model in RECIPES for gpus in gpu_counts]  # Hydra's sweep: the product, in order
    if [plan["world_size"] for plan in plans] != [gpus for gpus, _ in jobs]:
        raise SystemExit(f"the sweep's plans are not the layouts asked for:\n{result.stdout}")
    return {job: plan["predicted_efficiency"] for job, plan in zip(jobs, plans)}


def write_csv(path, efficiencies):
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["gpus", "model", "predicted_efficiency", "published_efficiency"])
        for (gpus, model), efficiency in efficiencies.items():
            published = PUBLISHED.get((gpus, model))
            writer.writerow([gpus, model, f"{efficiency:.4f}", "" if published is None else f"{published:.4f}"])


def plot(path, efficiencies, gpu_counts):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for (model, label), marker in zip(LABELS.items(), MARKERS):
        line, = axes.plot(gpu_counts, [100 * efficiencies[gpus, model] for gpus in gpu_counts],
                          label=f"{label}, predicted")
        published = sorted((gpus, value) for (gpus, name), value in PUBLISHED.items() if name == model)
        axes.plot([gpus for gpus, _ in published], [100 * value for _, value in published], marker,
                  color=line.get_color(), markersize=9, label=f"{label}, published")
    axes.set_xscale("log", base=2)
    axes.set_xticks(gpu_counts, [str(gpus) for gpus in gpu_counts])
    axes.set_xlabel("GPUs (4 per server, 25 Gbit/s between servers)")
    axes.set_ylabel("scaling efficiency (%)")
    axes.set_ylim(50, 102)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower left")
    axes.set_title("Horovod's benchmark: predicted, and published (16 and 128 GPUs: 2017, 512: 2018)",
                   fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "studies" / "horovod_scaling")
    parser.add_argument("--gpus", type=lambda text: [int(n) for n in text.split(",")], default=list(GPUS),
                        help="GPU counts, multiples of 4 (default: 4, 8, ..., 512)")
    args = parser.parse_args()
    if any(gpus % GPUS_PER_SERVER for gpus in args.gpus):
        parser.error(f"--gpus {args.gpus}: give multiples of {GPUS_PER_SERVER}")
    efficiencies = predicted(args.gpus)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "efficiency.csv", efficiencies)
    plot(args.out / "efficiency.png", efficiencies, args.gpus)
    print(f"wrote {args.out / 'efficiency.csv'} and {args.out / 'efficiency.png'}")
    for (gpus, model), published in sorted(PUBLISHED.items()):
        if (gpus, model) in efficiencies:
            error = efficiencies[gpus, model] - published
            print(f"{gpus} GPUs, {LABELS[model]}: predicted {100 * efficiencies[gpus, model]:.1f} %, published "
                  f"{100 * published:.1f} %, error {100 * error:+.1f} points")


if __name__ == "__main__":
    main()
