"""Images per second per core of the two ways an ImageFolder tree is decoded (data.decode), on
this machine's CPU, one process with one thread, side by side in the same rounds:

- cpu: what a loader worker does for each training sample: PIL decodes the JPEG, crops, resizes
  (antialiased), flips, normalizes;
- gpu on the CPU: the rank's code for data.decode=gpu with the CPU as its device: the worker's part
  (read the bytes, the crop from the JPEG header) and the batch decoded by torchvision's decoder
  (libjpeg-turbo here, nvJPEG on a GPU), then cropped, resized, flipped and normalized as tensors.

A generated ImageNet-shaped tree (tasks/image_tree.py: about 500 x 375, quality 90). Each round
checks that both ways gave the same labels and nearly the same pixels, so a wrong answer cannot
look fast. Prints the rates (min / median / max over the rounds) and writes them as JSON.

    python scripts/bench_decode.py [--images 256] [--rounds 5] [--size 224] [--out FILE]
"""

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from hvdtrain.tasks.data import IMAGENET_STD
from hvdtrain.tasks.image_folder_torch import DecodedImageFolder, EncodedImageFolder, _training_transform
from hvdtrain.tasks.image_tree import make_image_tree

BATCH = 64
CPU = torch.device("cpu")


def decode_on_cpu(root, keys, size):
    dataset = DecodedImageFolder(root, _training_transform(size), skip_bad=False)
    inputs = dataset.rank_inputs(CPU, torch.float32, torch.contiguous_format)
    batches = [dataset.collate([dataset[key] for key in keys[i:i + BATCH]]) for i in range(0, len(keys), BATCH)]
    return list(inputs.batches(batches))


def decode_on_device(root, keys, size):
    dataset = EncodedImageFolder(root, training=True, skip_bad=False, size=size, resize_size=size)
    inputs = dataset.rank_inputs(CPU, torch.float32, torch.contiguous_format)
    batches = [dataset.collate([dataset[key] for key in keys[i:i + BATCH]]) for i in range(0, len(keys), BATCH)]
    return list(inputs.batches(batches))


def timed(function, *args):
    began = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - began, result


def check_agree(cpu_batches, device_batches):
    for (a, labels_a), (b, labels_b) in zip(cpu_batches, device_batches, strict=True):
        levels = (a - b).abs() * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
        if not torch.equal(labels_a, labels_b) or levels.max() > 2:
            raise SystemExit(f"the two ways disagree: labels equal {torch.equal(labels_a, labels_b)}, "
                             f"largest difference {levels.max():.1f} levels of 255")


def machine():
    """The CPU's model name where Linux says it, and the cores."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--out", type=Path, default=Path("studies/decode_cpu/results.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as where:
        root = Path(where)
        per_class = args.images // 4
        make_image_tree(root, classes=4, train_per_class=per_class, val_per_class=1)
        keys = [(i, 1000 + i) for i in range(4 * per_class)]
        rates = {"cpu": [], "gpu on the cpu": []}
        for _ in range(args.rounds):  # alternated, so that drift in the machine's speed hits both
            seconds_cpu, cpu_batches = timed(decode_on_cpu, root / "train", keys, args.size)
            seconds_device, device_batches = timed(decode_on_device, root / "train", keys, args.size)
            check_agree(cpu_batches, device_batches)
            rates["cpu"].append(len(keys) / seconds_cpu)
            rates["gpu on the cpu"].append(len(keys) / seconds_device)
    summary = {name: {"min": min(r), "median": sorted(r)[len(r) // 2], "max": max(r)} for name, r in rates.items()}
    for name, figures in summary.items():
        print(f"{name:>15}: {figures['median']:7.1f} images/s per core (min {figures['min']:.1f}, "
              f"max {figures['max']:.1f}) over {args.rounds} rounds of {len(keys)} images")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": date.today().isoformat(), "machine": machine(),
                                    "torch": torch.__version__, "images": len(keys), "size": args.size,
                                    "rounds": args.rounds, "rates": rates, "summary": summary}, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
