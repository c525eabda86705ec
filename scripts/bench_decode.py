"""Images per second of the two ways an ImageFolder tree is decoded (data.decode), side by side in
the same rounds, in one process whose PyTorch has one thread (so the CPU's figures are per core):

- cpu: what a loader worker does for each training sample: PIL decodes the JPEG, crops, resizes
  (antialiased), flips, normalizes;
- gpu, the workers' part: what a loader worker does for data.decode=gpu: read the file's bytes,
  draw the crop from the size in its JPEG header, collate;
- gpu, the rank's part, on --device (cpu: torchvision's decoder is libjpeg-turbo; cuda: nvJPEG):
  the batch decoded, cropped, resized, flipped and normalized as tensors by DeviceImages, which
  makes its batches in a thread of its own, as a rank does.

Beside them, what that thread saves a rank whose training step leaves the GIL, as PyTorch's
kernels and a GPU's waits do: the rank's part followed, batch by batch, by a stand-in step
(single-threaded matrix products on the CPU, as long as the rank's part of a batch), once with each
batch made in turn before its step and once from DeviceImages.batches. Where each thread has a
core, ahead should take about half the time of in turn.

A generated ImageNet-shaped tree (tasks/image_tree.py: about 500 x 375, quality 90). Each round
checks that the two ways gave the same labels and nearly the same pixels (within 2 levels of 255
on the CPU; 1.5 on average on a GPU, whose decoder rounds differently), and that ahead and in turn
gave the same tensors, so a wrong answer cannot look fast. Prints the rates (min / median / max
over the rounds) and writes them as JSON.

    python scripts/bench_decode.py [--device cpu|cuda] [--images 256] [--rounds 5] [--size 224] [--out FILE]
"""

import argparse
import json
import os
import platform
import statistics
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


def batched(dataset, keys):
    """The loader's batches of `keys`, each made as a loader worker makes it."""
    return [dataset.collate([dataset[key] for key in keys[i:i + BATCH]]) for i in range(0, len(keys), BATCH)]


def decode_on_cpu(root, keys, size):
    """data.decode=cpu: the workers' batches, as the rank takes them."""
    dataset = DecodedImageFolder(root, _training_transform(size), skip_bad=False)
    return list(dataset.rank_inputs(CPU, torch.float32, torch.contiguous_format).batches(batched(dataset, keys)))


def workers_part(root, keys, size):
    """data.decode=gpu: the workers' batches of file bytes and crops."""
    return batched(EncodedImageFolder(root, training=True, skip_bad=False, size=size, resize_size=size), keys)


def in_turn(inputs, batches, step):
    """Each batch made on the calling thread, then its step."""
    made = []
    for batch in batches:
        made.append(inputs(batch))
        step()
    return made


def ahead(inputs, batches, step):
    """The batches made ahead by DeviceImages' thread, each followed by its step."""
    made = []
    for images_and_labels in inputs.batches(batches):
        made.append(images_and_labels)
        step()
    return made


def stand_in_step(seconds):
    """A function that takes about `seconds` in matrix products, which leave the GIL."""
    a = torch.randn(256, 256)
    began = time.perf_counter()
    for _ in range(20):
        a @ a
    repeats = max(1, round(seconds / ((time.perf_counter() - began) / 20)))

    def step():
        for _ in range(repeats):
            a @ a
    return step


def timed(device, function, *args):
    """(seconds, result) of function(*args), the device's work included."""
    began = time.perf_counter()
    result = function(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began, result


def check_agree(first_batches, second_batches, largest, mean):
    """Raise SystemExit unless the batches have equal labels and pixels within `largest` levels of
    255, and within `mean` on average."""
    for (a, labels_a), (b, labels_b) in zip(first_batches, second_batches, strict=True):
        levels = (a.cpu() - b.cpu()).abs() * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
        if not torch.equal(labels_a.cpu(), labels_b.cpu()) or levels.max() > largest or levels.mean() > mean:
            raise SystemExit(f"the ways disagree: labels equal {torch.equal(labels_a.cpu(), labels_b.cpu())}, "
                             f"difference largest {levels.max():.1f}, mean {levels.mean():.2f} levels of 255")


def machine(device):
    """The CPU's model name where Linux says it, the cores, and the GPU's name on CUDA."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    cpu = f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores"
    return f"{torch.cuda.get_device_name(device)}; {cpu}" if device.type == "cuda" else cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=torch.device, default=CPU, help="where the rank's part runs (cpu, cuda)")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--out", type=Path, help="default: studies/decode_DEVICE/results.json")
    args = parser.parse_args()
    device = args.device
    out = args.out or Path(f"studies/decode_{device.type}/results.json")
    torch.set_num_threads(1)
    rank_part = f"gpu, the rank's part on {device.type}"
    with tempfile.TemporaryDirectory() as where:
        root = Path(where) / "train"
        per_class = args.images // 4
        make_image_tree(root.parent, classes=4, train_per_class=per_class, val_per_class=1)
        keys = [(i, 1000 + i) for i in range(4 * per_class)]
        batches = workers_part(root, keys, args.size)
        if device.type == "cuda":
            batches = [batch.pin_memory() for batch in batches]  # as the DataLoader hands them over there
        inputs = EncodedImageFolder(root, training=True, skip_bad=False, size=args.size,
                                    resize_size=args.size).rank_inputs(device, torch.float32, torch.contiguous_format)
        # The stand-in step is as long as the rank's part of a batch once the decoder is set up: the
        # first pass also pays nvJPEG's and CUDA's set-up (on an H200, 13 times the rest), and a
        # step sized from it hid what the thread saves.
        timed(device, in_turn, inputs, batches, lambda: None)
        seconds, _ = timed(device, in_turn, inputs, batches, lambda: None)
        step = stand_in_step(seconds / len(batches))
        rates = {name: [] for name in ("cpu", "gpu, the workers' part", rank_part, "in turn with a step",
                                       "ahead of a step")}
        for _ in range(args.rounds):  # alternated, so that drift in the machine's speed hits all
            seconds_cpu, on_cpu = timed(CPU, decode_on_cpu, root, keys, args.size)
            seconds_workers, _ = timed(CPU, workers_part, root, keys, args.size)
            seconds_rank, on_device = timed(device, lambda: list(inputs.batches(batches)))
            check_agree(on_cpu, on_device, *((2, 2) if device.type == "cpu" else (255, 1.5)))
            seconds_in_turn, made_in_turn = timed(device, in_turn, inputs, batches, step)
            seconds_ahead, made_ahead = timed(device, ahead, inputs, batches, step)
            check_agree(made_in_turn, made_ahead, 0, 0)
            for name, seconds in zip(rates, (seconds_cpu, seconds_workers, seconds_rank, seconds_in_turn,
                                             seconds_ahead)):
                rates[name].append(len(keys) / seconds)
    summary = {name: {"min": min(r), "median": statistics.median(r), "max": max(r)} for name, r in rates.items()}
    for name, figures in summary.items():
        print(f"{name:>28}: {figures['median']:8.1f} images/s (min {figures['min']:.1f}, max {figures['max']:.1f})")
    ratio = summary["ahead of a step"]["median"] / summary["in turn with a step"]["median"]
    print(f"ahead / in turn, medians: {ratio:.2f}; {args.rounds} rounds of {len(keys)} images, batches of {BATCH}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": date.today().isoformat(), "machine": machine(device),
                               "torch": torch.__version__, "device": str(device), "images": len(keys),
                               "size": args.size, "rounds": args.rounds, "rates": rates, "summary": summary,
                               "ahead_over_in_turn": ratio}, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
