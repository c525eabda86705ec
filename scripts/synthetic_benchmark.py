"""Training throughput on synthetic data, with the flags and output lines of Horovod's
synthetic benchmarks for PyTorch and TensorFlow 2.

    mpirun -np 2 python scripts/synthetic_benchmark.py --model resnet50 --batch-size 8 --no-cuda
    mpirun -np 2 python scripts/synthetic_benchmark.py --framework tensorflow --model resnet50 ...
    mpirun -np 2 python scripts/synthetic_benchmark.py --ddp ...     # PyTorch DDP instead
    python scripts/synthetic_benchmark.py --no-cuda ...               # one process: the plain loop
    python scripts/synthetic_benchmark.py --plain --amp --batch-size 64  # one GPU, no hvdtrain at all
    HOROVOD_ELASTIC=1 python scripts/synthetic_benchmark.py --amp --batch-size 64  # the engine, one GPU

PyTorch trains a torchvision model through hvdtrain.torch's DistributedOptimizer; TensorFlow
trains the Keras application of the same name (resnet50: ResNet50, inception_v3: InceptionV3)
with hvdtrain.tensorflow's DistributedGradientTape in a tf.function, as Horovod's
tensorflow2_synthetic_benchmark.py does. Both use SGD with LR 0.01 and are timed alike: on a GPU,
a step returns once its work is queued, so the device is synchronised before every clock reading.
--ddp runs the PyTorch loop with torch.nn.parallel.DistributedDataParallel (NCCL on a GPU, gloo on
the CPU), its ranks and rendezvous taken from mpirun's environment, for a side-by-side figure. --plain runs the
loop without hvdtrain at all. --amp trains under fp16 autocast with a GradScaler, in Horovod's
pattern (synchronize, unscale, step with skip_synchronize); --bf16 and --channels-last train as the recipes'
train.autocast=bf16 and train.channels_last=true do. --profile DIR runs a few more steps
under torch.profiler after the timed ones and writes, per rank, a Chrome trace (Perfetto opens it)
and a table of the operators' host time, and prints how much of that time the GPU was busy: the
host-side gaps that keep a GPU waiting are what hvdtrain's per-step work could cause. In a job
of one rank the DistributedOptimizer reduces nothing, as Horovod's, unless HOROVOD_ELASTIC=1 says
that the job is elastic (its world may grow): setting it makes one process reduce through the
engine anyway (NCCL on one GPU), which is how the engine's cost on a GPU is measured.
"""

import argparse
import os
import timeit
from dataclasses import dataclass
from typing import Callable

import numpy as np

NUM_CLASSES = 1000


def parse_args():
    parser = argparse.ArgumentParser(description="Synthetic benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch",
                        help="train with hvdtrain.torch or hvdtrain.tensorflow")
    parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression")
    parser.add_argument("--model", type=str, default="resnet50",
                        help="model to benchmark: a torchvision model, or with tensorflow the Keras application "
                             "of that name (resnet50: ResNet50)")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="batches before timing")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disable CUDA")
    parser.add_argument("--ddp", action="store_true", default=False,
                        help="use torch DistributedDataParallel (gloo) instead of hvdtrain")
    parser.add_argument("--plain", action="store_true", default=False, help="a plain PyTorch loop, no hvdtrain")
    parser.add_argument("--amp", action="store_true", default=False,
                        help="fp16 autocast with a GradScaler (PyTorch on a GPU)")
    parser.add_argument("--bf16", action="store_true", default=False,
                        help="bf16 autocast, no GradScaler (PyTorch on a GPU), as train.autocast=bf16")
    parser.add_argument("--channels-last", action="store_true", default=False,
                        help="the model and its batch in channels_last (PyTorch), as train.channels_last=true")
    parser.add_argument("--profile", metavar="DIR", help="after the benchmark, profile a few steps into DIR")
    parser.add_argument("--profile-steps", type=int, default=5, help="steps under the profiler")
    args = parser.parse_args()
    if (args.ddp or args.plain or args.amp or args.bf16 or args.channels_last or args.profile) \
            and args.framework != "torch":
        parser.error("--ddp, --plain, --amp, --bf16, --channels-last and --profile are options of the PyTorch "
                     "loop: they go with --framework torch")
    if args.amp and args.bf16:
        parser.error("--amp (fp16) and --bf16 are two autocast dtypes: give one")
    args.image_size = 299 if args.model == "inception_v3" else 224
    return args


@dataclass
class Job:
    """This rank's place in the job and one training step on its synthetic batch."""

    rank: int
    size: int
    device: str  # "CPU" or "GPU", as the output lines name it
    step: Callable[[], None]
    synchronize: Callable[[], None]  # returns when the device has done every step queued so far


def timed_steps(job, count):
    """Seconds that `count` steps take, measured between synchronised devices."""
    def steps():
        for _ in range(count):
            job.step()
        job.synchronize()

    job.synchronize()
    return timeit.timeit(steps, number=1)


def _nothing_to_wait_for():
    pass


# Chrome-trace categories of work on the device (torch.profiler's kineto export).
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def device_busy_fraction(events):
    """The share of a trace's span (its first event's start to its last event's end) in which
    the device ran something, counting overlapping device work once; None without device work."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and "dur" in e
                   and e.get("cat") in DEVICE_CATEGORIES)
    if not spans:
        return None
    timed = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and "dur" in e]
    window = max(end for _, end in timed) - min(start for start, _ in timed)
    busy, covered_to = 0.0, float("-inf")
    for start, end in spans:
        if end > covered_to:
            busy += end - max(start, covered_to)
            covered_to = end
    return busy / window if window > 0 else None


def profile_steps(job, args):
    """Run --profile-steps steps under torch.profiler; write this rank's trace (gzipped) and its
    operator table into --profile; returns the device's busy share of the steps, or None."""
    import gzip
    import json
    import shutil

    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if job.device == "GPU":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    os.makedirs(args.profile, exist_ok=True)
    job.synchronize()
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(args.profile_steps):
            job.step()
        job.synchronize()
    trace = os.path.join(args.profile, f"trace.{job.rank}.json")
    profiler.export_chrome_trace(trace)
    with open(os.path.join(args.profile, f"operators.{job.rank}.txt"), "w") as table:
        table.write(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    with open(trace) as f:
        busy = device_busy_fraction(json.load(f)["traceEvents"])
    with open(trace, "rb") as source, gzip.open(trace + ".gz", "wb") as target:
        shutil.copyfileobj(source, target)
    os.remove(trace)
    return busy


def torch_job(args):
    import torch
    import torch.nn.functional as F
    import torchvision

    cuda = not args.no_cuda and torch.cuda.is_available()
    model = getattr(torchvision.models, args.model)()
    if cuda:
        model.cuda()
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.plain:
        rank, size = 0, 1
    else:
        distribute = _distributed_data_parallel if args.ddp else _hvdtrain_torch
        rank, size, model, optimizer = distribute(model, optimizer, args)
    autocast = (args.amp or args.bf16) and cuda
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp and cuda)  # bf16 needs no loss scaling

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size).contiguous(memory_format=layout)
    target = torch.randint(0, NUM_CLASSES, (args.batch_size,))
    if cuda:
        data, target = data.cuda(), target.cuda()

    def step():
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16 if args.bf16 else torch.float16, enabled=autocast):
            output = model(data)
            if isinstance(output, tuple) or hasattr(output, "logits"):  # inception's auxiliary output
                output = output[0]
            loss = F.cross_entropy(output, target)
        backward_and_step(loss, optimizer, scaler)

    return Job(rank, size, "GPU" if cuda else "CPU", step, torch.cuda.synchronize if cuda else _nothing_to_wait_for)


def backward_and_step(loss, optimizer, scaler):
    """Backward from `loss` and the optimizer's step through `scaler`, a GradScaler (a disabled one
    steps plainly), in Horovod's AMP pattern where the optimizer is hvdtrain's: the averaged
    gradients are unscaled, then stepped without synchronizing again."""
    scaler.scale(loss).backward()
    if scaler.is_enabled() and hasattr(optimizer, "skip_synchronize"):
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
    else:
        scaler.step(optimizer)
    scaler.update()


def _hvdtrain_torch(model, optimizer, args):
    """The distributed part of the loop, through hvdtrain.torch (as with Horovod)."""
    import hvdtrain.torch as hvd

    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return hvd.rank(), hvd.size(), model, optimizer


def _distributed_data_parallel(model, optimizer, args):
    """The same loop with PyTorch's own data parallelism: NCCL where the model is on a GPU, gloo
    on the CPU."""
    import torch
    import torch.distributed as dist

    if args.fp16_allreduce:
        raise SystemExit("--fp16-allreduce is an hvdtrain option; DDP would need a communication hook")
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", 0)))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29512")
    on_gpu = next(model.parameters()).is_cuda
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                            world_size=size)
    device_ids = [torch.cuda.current_device()] if on_gpu else None
    return rank, size, torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids), optimizer


def tensorflow_job(args):
    import keras
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd

    application = _keras_application(args.model)
    hvd.init()
    gpus = [] if args.no_cuda else tf.config.list_physical_devices("GPU")
    tf.config.set_visible_devices(gpus[hvd.local_rank():hvd.local_rank() + 1], "GPU")  # the local rank's, or none
    shape = (args.image_size, args.image_size, 3)
    model = application(weights=None, input_shape=shape, classes=NUM_CLASSES)
    optimizer = keras.optimizers.SGD(0.01)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    hvd.broadcast_variables(model.weights, root_rank=0)

    data = tf.random.normal((args.batch_size, *shape))
    target = tf.random.uniform((args.batch_size,), maxval=NUM_CLASSES, dtype=tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(target, model(data, training=True)))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)

    synchronize = tf.test.experimental.sync_devices if gpus else _nothing_to_wait_for
    return Job(hvd.rank(), hvd.size(), "GPU" if gpus else "CPU", step, synchronize)


def _keras_application(name):
    """The Keras application of a torchvision model name: resnet50 is ResNet50, inception_v3 is
    InceptionV3, mobilenet_v3_small is MobileNetV3Small."""
    import keras

    applications = {n.lower(): n for n in dir(keras.applications) if n[0].isupper()}
    found = applications.get(name.replace("_", "").lower())
    if found is None:
        raise SystemExit(f"--model {name}: Keras has no such application; with --framework tensorflow use one of "
                         f"{', '.join(sorted(applications.values()))}, written as torchvision names them "
                         f"(e.g. resnet50, mobilenet_v3_small)")
    return getattr(keras.applications, found)


def main():
    args = parse_args()
    job = (tensorflow_job if args.framework == "tensorflow" else torch_job)(args)
    device = job.device

    def log(text):
        if job.rank == 0:
            print(text, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {job.size}")
    log("Running warmup...")
    timed_steps(job, args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for iteration in range(args.num_iters):
        seconds = timed_steps(job, args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{iteration}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)
    mean, confidence = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {mean:.1f} +-{confidence:.1f}")
    log(f"Total img/sec on {job.size} {device}(s): {job.size * mean:.1f} +-{job.size * confidence:.1f}")
    if args.profile:
        busy = profile_steps(job, args)
        log(f"Profile of {args.profile_steps} steps in {args.profile}" +
            ("" if busy is None else f": the {device} was busy {busy:.1%} of the time"))


if __name__ == "__main__":
    main()
