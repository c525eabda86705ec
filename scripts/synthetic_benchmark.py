"""Training throughput on synthetic data, with the flags and output lines of Horovod's
PyTorch synthetic benchmark.

    mpirun -np 2 python scripts/synthetic_benchmark.py --model resnet50 --batch-size 8 --no-cuda
    mpirun -np 2 python scripts/synthetic_benchmark.py --ddp ...     # PyTorch DDP on gloo instead
    python scripts/synthetic_benchmark.py --no-cuda ...               # one process: the plain loop

--ddp runs the same loop with torch.nn.parallel.DistributedDataParallel (gloo backend), its
ranks and rendezvous taken from mpirun's environment, for a side-by-side figure.
"""

import argparse
import os
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torchvision


def parse_args():
    parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression")
    parser.add_argument("--model", type=str, default="resnet50", help="torchvision model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="batches before timing")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disable CUDA")
    parser.add_argument("--ddp", action="store_true", default=False,
                        help="use torch DistributedDataParallel (gloo) instead of hvdtrain")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


class Hvdtrain:
    """The distributed part of the loop, through hvdtrain.torch (as with Horovod)."""

    def __init__(self, model, optimizer, args):
        import hvdtrain.torch as hvd

        hvd.init()
        self.size, self.rank = hvd.size(), hvd.rank()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        self.model = model
        self.optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                  compression=compression)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)


class DistributedDataParallel:
    """The same loop with PyTorch's own data parallelism on the gloo backend."""

    def __init__(self, model, optimizer, args):
        import torch.distributed as dist

        if args.fp16_allreduce:
            raise SystemExit("--fp16-allreduce is an hvdtrain option; DDP would need a communication hook")
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", 0)))
        size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
        address = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = os.environ.get("MASTER_PORT", "29512")
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=size)
        self.size, self.rank = size, rank
        self.model = torch.nn.parallel.DistributedDataParallel(model)
        self.optimizer = optimizer


def main():
    args = parse_args()
    model = getattr(torchvision.models, args.model)()
    if args.cuda:
        model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    job = (DistributedDataParallel if args.ddp else Hvdtrain)(model, optimizer, args)
    model, optimizer = job.model, job.optimizer

    image_size = 299 if args.model == "inception_v3" else 224
    data = torch.randn(args.batch_size, 3, image_size, image_size)
    target = torch.randint(0, 1000, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step():
        optimizer.zero_grad()
        output = model(data)
        if isinstance(output, tuple) or hasattr(output, "logits"):  # inception's auxiliary output
            output = output[0]
        F.cross_entropy(output, target).backward()
        optimizer.step()

    def log(text):
        if job.rank == 0:
            print(text, flush=True)

    device = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {job.size}")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for iteration in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{iteration}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)
    mean, confidence = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {mean:.1f} +-{confidence:.1f}")
    log(f"Total img/sec on {job.size} {device}(s): {job.size * mean:.1f} +-{job.size * confidence:.1f}")


if __name__ == "__main__":
    main()
