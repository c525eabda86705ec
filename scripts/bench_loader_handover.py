"""What it costs a rank to take data.decode=gpu's batches from its loader workers: the CPU time of
the thread that iterates the DataLoader (unpickling the batch, mapping its shared memory) and the
wall time per batch, with the workers' own work (reading the files, the crops from the JPEG
headers, collating) running beside it.

A generated ImageNet-shaped tree (tasks/image_tree.py), the training set's EncodedImageFolder in
a DataLoader with persistent workers, as the rank's training loader; one epoch to start the
workers, then the median over the epochs that follow. Each batch's labels are checked against the
samples asked for, so a loader that loses samples cannot look fast.

    python scripts/bench_loader_handover.py [--images 1024] [--batch 256] [--workers 2] [--epochs 5]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from hvdtrain.tasks.image_folder_torch import EncodedImageFolder
from hvdtrain.tasks.image_tree import make_image_tree


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as where:
        make_image_tree(Path(where), classes=4, train_per_class=args.images // 4, val_per_class=1)
        dataset = EncodedImageFolder(Path(where) / "train", training=True, skip_bad=False, size=224, resize_size=224)
        keys = [(i, 7 + i) for i in range(len(dataset))]
        batches = [keys[i:i + args.batch] for i in range(0, len(keys), args.batch)]
        expected = [torch.tensor([dataset.samples[i][1] for i, _ in batch]) for batch in batches]
        loader = DataLoader(dataset, batch_sampler=batches, num_workers=args.workers, collate_fn=dataset.collate,
                            persistent_workers=True)
        thread_ms, wall_ms = [], []
        for epoch in range(args.epochs + 1):
            thread_s, began = 0.0, time.perf_counter()
            taken = iter(loader)
            for want in expected:
                started = time.thread_time()
                batch = next(taken)
                thread_s += time.thread_time() - started
                if not torch.equal(batch.labels, want):
                    raise SystemExit(f"epoch {epoch}: a batch's labels are not those of the samples asked for")
            if epoch:  # the first epoch starts the workers
                thread_ms.append(1000 * thread_s / len(batches))
                wall_ms.append(1000 * (time.perf_counter() - began) / len(batches))
    print(f"{len(keys)} images in batches of {args.batch}, {args.workers} workers, {args.epochs} epochs after "
          f"the first; per batch, median (each epoch):")
    for name, figures in (("the taking thread's CPU", thread_ms), ("wall time", wall_ms)):
        print(f"{name}: {statistics.median(figures):.1f} ms ({', '.join(f'{ms:.1f}' for ms in figures)})")


if __name__ == "__main__":
    main()
