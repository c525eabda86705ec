"""The engine against raw MPI (on the CPU) or raw NCCL (on a GPU) on the gradients of a real model.

    mpirun -np 2 python scripts/bench_allreduce.py --model resnet101
    python scripts/bench_allreduce.py --device cuda            # one GPU; mpirun -np N for N GPUs

Measures, with the gradients of a torchvision model (ResNet-101: 314 tensors, 178 MB) laid out
as hvdtrain.torch's DistributedOptimizer lays them out (views of one flat bucket):
  (b) the best raw mpi4py Allreduce of the same bytes (the bucket itself): in one call, or in
      pieces of 16, 4 or 1 MiB; measured while no engine runs;
  (a) the engine reducing the list of named tensors (default settings);
  (c) the engine with fusion off (HOROVOD_FUSION_THRESHOLD=0), on separately allocated tensors.
Beside them the engine's Average and Adasum of the bucket (on a power of two of ranks), and
  (d) raw MPI doing an average's work: the Allreduce in 1 MiB pieces, each scaled by 1/size
      right after, the engine's Average's own reference.
Beside them: the same bucket submitted as one tensor, which leaves the engine's fixed cost per
step (waking, negotiating, finishing) and takes away its cost per tensor.
The machine's speed drifts by tens of percent within minutes, so the run is made of --rounds
rounds, each timing raw MPI and then every engine variant, in an order that rotates between
rounds (each a median of --repeats timed runs after --warmup, all ranks starting together).
A ratio is taken within a round; the figures printed are medians over the rounds. Ratios
above 1 mean the engine is faster.
Every timed run reduces inputs set just before it (outside the timed region) to a known pattern,
and its result is checked against the exact value computed from that pattern: a wrong result
stops the whole job (MPI_Abort) with the variant, rank, tensor and element at fault.

With --device cuda the gradients lie on the GPU (cuda:local_rank) and the reference is one raw
NCCL allreduce (CuPy's NcclCommunicator) of the whole bucket, in place, on a stream of its own;
a timed run ends when the device has finished (the stream is synchronized), for both. Beside
the ratios it prints NCCL's bus bandwidth, 2 (n - 1) / n x bytes / time.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

MIB = 1 << 20
# Rank r's element i is (r + 1) * (i % PATTERN_PERIOD + 1): small integers, so that sums over up
# to a few hundred ranks are exact in float32; a period prime to common tensor sizes makes
# tensors of one shape differ, so that results landing in the wrong tensor are caught too.
PATTERN_PERIOD = 251


class WrongResult(AssertionError):
    """A collective's result differs from the value computed from its inputs."""


@dataclass
class Workload:
    """Arrays that a collective reduces in place, and `bases`: for each array, the small integers
    its elements are multiples of (see PATTERN_PERIOD)."""
    arrays: List[Tuple[str, np.ndarray]]
    bases: List[np.ndarray]

    def fill(self, rank):
        for (_, array), base in zip(self.arrays, self.bases):
            if isinstance(array, np.ndarray):
                np.multiply(base, rank + 1, out=array)
            else:  # device memory (CuPy): set from the host
                array.set(base * np.float32(rank + 1))

    def check(self, average, size, rank, what):
        """Raise WrongResult unless every array holds the sum (or average) of every rank's fill."""
        rank_sum = size * (size + 1) / 2
        factor = rank_sum / size if average else rank_sum
        # A sum of integers is exact; an average may be scaled by a rounded 1/size.
        tolerance = 1e-6 if average else 0.0
        for (name, array), base in zip(self.arrays, self.bases):
            if not isinstance(array, np.ndarray):
                array = array.get()
            expected = base * np.float32(factor)
            wrong = ~np.isclose(array, expected, rtol=tolerance, atol=0.0)
            if wrong.any():
                index = np.unravel_index(np.argmax(wrong), array.shape)
                raise WrongResult(f"{what}: wrong result on rank {rank} in {name}[{', '.join(map(str, index))}]: "
                                  f"{float(array[index])}, expected {float(expected[index])} "
                                  f"({np.count_nonzero(wrong)} of {array.size} elements wrong)")


def pattern(total_elements):
    """The bases of one flat array of `total_elements` (float32)."""
    return (np.arange(total_elements) % PATTERN_PERIOD + 1).astype(np.float32)


def workload(arrays, flat_pattern):
    """`arrays` ([(name, array)], in bucket order) with their places in `flat_pattern` as bases, so
    that the same gradient has the same inputs however it is laid out."""
    bases, offset = [], 0
    for _, array in arrays:
        bases.append(flat_pattern[offset:offset + array.size].reshape(array.shape))
        offset += array.size
    return Workload(arrays, bases)


def gradient_bucket(model_name, device="cpu"):
    """[(name, view of the gradient)] and the flat bucket holding them, allocated as
    hvdtrain.torch's DistributedOptimizer allocates it on `device` (NumPy views on the CPU, CuPy
    views on a GPU)."""
    import torchvision

    from hvdtrain.torch import mpi_ops
    from hvdtrain.torch.optimizer import _GradientBuckets

    named = list(getattr(torchvision.models, model_name)().to(device).named_parameters())
    buckets = _GradientBuckets([p for _, p in named], "gradients")
    bucket = buckets.spec[named[0][1]][1]  # every parameter is float32: one bucket
    views = []
    for name, p in named:
        flat, offset, numel = buckets.place[p]
        views.append((name, mpi_ops._array(flat[offset:offset + numel])))
    return views, bucket


def on_small_pages(in_bucket, bucket):
    """The same tensors in a bucket from torch.zeros, whose memory gets 4 KiB pages, as
    hvdtrain.torch allocated buckets before it asked for huge pages."""
    import torch

    flat = torch.zeros(bucket.size, dtype=torch.float32).numpy()
    views, offset = [], 0
    for name, array in in_bucket:
        views.append((name, flat[offset:offset + array.size].reshape(array.shape)))
        offset += array.size
    return views, flat


@contextlib.contextmanager
def environment(**variables):
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def median_time(run, work, average, what, warmup, repeats, barrier):
    """The median time of `run` reducing `work` (after `warmup` runs), each run on freshly filled
    inputs and checked; `average`: whether `run` averages rather than sums."""
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    times = []
    for i in range(warmup + repeats):
        work.fill(rank)
        barrier()
        started = time.perf_counter()
        run()
        elapsed = time.perf_counter() - started
        work.check(average, size, rank, what)
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def raw_mpi_best(flat, flat_pattern, warmup, repeats):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total_elements = flat.size
    work = workload([("bucket", flat)], flat_pattern)
    results = {}
    for label, piece_bytes in (("flat", None), ("16MiB", 16 * MIB), ("4MiB", 4 * MIB), ("1MiB", MIB)):
        step = total_elements if piece_bytes is None else piece_bytes // 4

        def run():
            for start in range(0, total_elements, step):
                comm.Allreduce(MPI.IN_PLACE, flat[start:start + step], MPI.SUM)

        results[label] = median_time(run, work, False, f"raw MPI Allreduce, {label}", warmup, repeats, comm.Barrier)
    return results


def raw_mpi_average(flat, flat_pattern, warmup, repeats):
    """Raw MPI doing what an average must: the Allreduce in 1 MiB pieces, each piece scaled by
    1/size right after (NumPy, in place), the reference for the engine's Average."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    step, scale = MIB // 4, 1.0 / comm.Get_size()

    def run():
        for start in range(0, flat.size, step):
            piece = flat[start:start + step]
            comm.Allreduce(MPI.IN_PLACE, piece, MPI.SUM)
            np.multiply(piece, scale, out=piece)

    return median_time(run, workload([("bucket", flat)], flat_pattern), True, "raw MPI Allreduce, 1MiB, scaled",
                       warmup, repeats, comm.Barrier)


def engine_time(what, tensors, flat_pattern, op, warmup, repeats, bucket=None):
    """`bucket`: the flat array the tensors are views of, as the DistributedOptimizers lay out
    gradients; None for separately allocated tensors."""
    from hvdtrain import core

    core.init()
    names = [f"grad.{name}" for name, _ in tensors]
    bucket_spec = None if bucket is None else ("gradients", bucket)

    def run():
        handles = [core.allreduce_async(array, name=name, op=op, bucket=bucket_spec)
                   for name, (_, array) in zip(names, tensors)]
        for handle in handles:
            handle.wait()

    # The ranks' fills are multiples of one another, whose Adasum is their average
    averaged = op in (core.ReduceOp.AVERAGE, core.ReduceOp.ADASUM)
    seconds = median_time(run, workload(tensors, flat_pattern), averaged, what, warmup, repeats, core.barrier)
    core.shutdown()
    return seconds


def one_round(index, tensors, in_bucket, bucket, small_pages, flat_pattern, warmup, repeats):
    """Raw MPI, then every engine variant once: {"raw": {...}, "raw_average": seconds, "engine": {...},
    "negotiation": {...}}.
    The machine can slow down within a round, so round `index` starts the engine variants at
    the index-th, and none of them is always last."""
    from mpi4py import MPI

    from hvdtrain import core
    from hvdtrain.core.adasum import is_power_of_two

    SUM, AVERAGE, ADASUM = core.ReduceOp.SUM, core.ReduceOp.AVERAGE, core.ReduceOp.ADASUM
    raw = raw_mpi_best(bucket, flat_pattern, warmup, repeats)
    raw_average = raw_mpi_average(bucket, flat_pattern, warmup, repeats)
    small_pages_views, small_pages_bucket = small_pages

    def measure(name, tensors, op, bucket=None, variables=None):
        with environment(**(variables or {})):
            return engine_time(name, tensors, flat_pattern, op, warmup, repeats, bucket)

    variants = {  # name: (tensors, op, the bucket they are views of, environment)
        "bucket_sum": (in_bucket, SUM, bucket),
        "bucket_sum_small_pages": (small_pages_views, SUM, small_pages_bucket),
        "bucket_sum_one_tensor": ([("all", bucket)], SUM, bucket),
        "bucket_average": (in_bucket, AVERAGE, bucket),
        "bucket_adasum": (in_bucket, ADASUM, bucket),
        "separate_sum": (tensors, SUM),
        "separate_sum_fusion_off": (tensors, SUM, None, {"HOROVOD_FUSION_THRESHOLD": "0"}),
    }
    if not is_power_of_two(MPI.COMM_WORLD.Get_size()):  # where Adasum cannot run
        del variants["bucket_adasum"]
    names = list(variants)
    start = index % len(names)
    engine = {name: measure(name, *variants[name]) for name in names[start:] + names[:start]}
    engine = {name: engine[name] for name in names}
    # Negotiation alone: as many tensors, of one element each, with the response cache (one
    # bit-vector allreduce per cycle) and without it (the coordinator gathers every request).
    tiny = [(name, np.empty(1, np.float32)) for name, _ in tensors]
    negotiation = {"cached": measure("negotiation_cached", tiny, SUM),
                   "uncached": measure("negotiation_uncached", tiny, SUM, None, {"HOROVOD_CACHE_CAPACITY": "0"})}
    return {"raw": raw, "raw_average": raw_average, "engine": engine, "negotiation": negotiation}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet101")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file (rank 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.device == "cuda":
        return gpu_main(args)

    from mpi4py import MPI

    in_bucket, bucket = gradient_bucket(args.model)
    separate = [(name, np.empty(array.shape, np.float32)) for name, array in in_bucket]
    small_pages = on_small_pages(in_bucket, bucket)
    flat_pattern = pattern(bucket.size)
    try:
        rounds = [one_round(i, separate, in_bucket, bucket, small_pages, flat_pattern, args.warmup, args.repeats)
                  for i in range(args.rounds)]
    except WrongResult as error:
        # Loudly, and at once everywhere: the other ranks may be waiting in the next collective.
        print(f"bench_allreduce: {error}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)

    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    for r in rounds:
        r["ratio"] = {k: min(r["raw"].values()) / v for k, v in r["engine"].items()}

    def median_ms(part, key):
        return statistics.median(r[part][key] for r in rounds) * 1e3

    raw_labels, engine_labels = rounds[0]["raw"].keys(), rounds[0]["engine"].keys()
    report = {
        "model": args.model,
        "ranks": MPI.COMM_WORLD.Get_size(),
        "tensors": len(in_bucket),
        "megabytes": round(bucket.nbytes / 1e6, 1),
        "rounds": args.rounds,
        "raw_mpi_ms": {k: round(median_ms("raw", k), 2) for k in raw_labels},
        "raw_mpi_best_ms": round(statistics.median(min(r["raw"].values()) for r in rounds) * 1e3, 2),
        "engine_ms": {k: round(median_ms("engine", k), 2) for k in engine_labels},
        "ratio_best_raw_over_engine": {k: round(statistics.median(r["ratio"][k] for r in rounds), 3)
                                       for k in engine_labels},
        "ratio_by_round": {k: [round(r["ratio"][k], 3) for r in rounds] for k in engine_labels},
        "negotiation_ms": {k: round(median_ms("negotiation", k), 3) for k in ("cached", "uncached")},
        "raw_mpi_average_ms": round(statistics.median(r["raw_average"] for r in rounds) * 1e3, 2),
        "ratio_raw_average_over_engine_average": round(statistics.median(
            r["raw_average"] / r["engine"]["bucket_average"] for r in rounds), 3),
    }
    print(f"{args.model}: {len(in_bucket)} tensors, {report['megabytes']} MB, {report['ranks']} ranks; "
          f"{args.rounds} rounds of raw MPI then the engine, each a median of {args.repeats} after "
          f"{args.warmup} warm-up; medians over the rounds")
    for label, ms in report["raw_mpi_ms"].items():
        print(f"  raw MPI Allreduce, {label:>5}:              {ms:8.2f} ms")
    print(f"  (b) best raw MPI in each round:             {report['raw_mpi_best_ms']:8.2f} ms")
    print(f"  (d) raw MPI, 1MiB, each piece then scaled:  {report['raw_mpi_average_ms']:8.2f} ms   (Average's work)")
    labels = {
        "bucket_sum": "(a) engine, Sum, gradients in a bucket",
        "bucket_sum_small_pages": "    engine, Sum, bucket on 4 KiB pages",
        "bucket_sum_one_tensor": "    engine, Sum, the bucket as one tensor",
        "bucket_average": "    engine, Average, gradients in a bucket",
        "bucket_adasum": "    engine, Adasum, gradients in a bucket",
        "separate_sum": "    engine, Sum, separate tensors",
        "separate_sum_fusion_off": "(c) engine, Sum, separate, fusion off",
    }
    for key, label in labels.items():
        if key not in engine_labels:
            continue
        rounds_text = " ".join(f"{x:.2f}" for x in report["ratio_by_round"][key])
        print(f"  {label:<42} {report['engine_ms'][key]:8.2f} ms   (b)/this = "
              f"{report['ratio_best_raw_over_engine'][key]:.3f}  (rounds: {rounds_text})")
    print(f"  engine Average against (d): (d)/this = {report['ratio_raw_average_over_engine_average']:.3f}")
    print(f"  negotiation of {len(in_bucket)} one-element tensors: {report['negotiation_ms']['cached']:.2f} ms with "
          f"the response cache, {report['negotiation_ms']['uncached']:.2f} ms through the coordinator "
          f"(HOROVOD_CACHE_CAPACITY=0)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


# ----------------------------------------------------------------------------- on a GPU


def gpu_gradient_bucket(model_name):
    """As gradient_bucket, on this rank's GPU: CuPy views of the optimizer's device bucket."""
    import torch

    from hvdtrain import core

    device = torch.device("cuda", core.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return gradient_bucket(model_name, device)


def raw_nccl_time(bucket, flat_pattern, warmup, repeats):
    """One NCCL allreduce of the whole bucket, in place, with CuPy's bindings and nothing else."""
    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    unique_id = comm.bcast(nccl.get_unique_id() if comm.Get_rank() == 0 else None, root=0)
    communicator = nccl.NcclCommunicator(comm.Get_size(), unique_id, comm.Get_rank())
    stream = cupy.cuda.Stream(non_blocking=True)

    def run():
        communicator.allReduce(bucket.data.ptr, bucket.data.ptr, bucket.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                               stream.ptr)
        stream.synchronize()

    seconds = median_time(run, workload([("bucket", bucket)], flat_pattern), False, "raw NCCL allreduce", warmup,
                          repeats, comm.Barrier)
    communicator.destroy()
    return seconds


def gpu_engine_time(what, tensors, flat_pattern, op, warmup, repeats, bucket=None):
    import cupy

    from hvdtrain import core

    names = [f"grad.{name}" for name, _ in tensors]
    bucket_spec = None if bucket is None else ("gradients", bucket)
    stream = cupy.cuda.Stream(non_blocking=True)  # the caller's stream, as a training step's

    def run():
        with stream:
            handles = [core.allreduce_async(array, name=name, op=op, bucket=bucket_spec, stream=stream.ptr)
                       for name, (_, array) in zip(names, tensors)]
            for handle in handles:
                handle.wait(stream.ptr)
        stream.synchronize()

    return median_time(run, workload(tensors, flat_pattern), op == core.ReduceOp.AVERAGE, what, warmup, repeats,
                       core.barrier)


def gpu_main(args):
    import cupy
    from mpi4py import MPI

    from hvdtrain import core

    core.init()
    in_bucket, bucket = gpu_gradient_bucket(args.model)
    separate = [(name, cupy.empty(array.shape, np.float32)) for name, array in in_bucket]
    flat_pattern = pattern(bucket.size)
    SUM, AVERAGE = core.ReduceOp.SUM, core.ReduceOp.AVERAGE
    variants = {  # name: (tensors, op, the bucket they are views of)
        "bucket_sum": (in_bucket, SUM, bucket),
        "bucket_average": (in_bucket, AVERAGE, bucket),
        "bucket_sum_one_tensor": ([("all", bucket)], SUM, bucket),
        "separate_sum": (separate, SUM, None),
    }
    rounds = []
    try:
        for index in range(args.rounds):
            raw = raw_nccl_time(bucket, flat_pattern, args.warmup, args.repeats)
            names = list(variants)[index % len(variants):] + list(variants)[:index % len(variants)]
            engine = {}
            for name in names:
                tensors, op, in_bucket_of = variants[name]
                engine[name] = gpu_engine_time(name, tensors, flat_pattern, op, args.warmup, args.repeats, in_bucket_of)
            rounds.append({"raw": raw, "engine": engine, "ratio": {k: raw / v for k, v in engine.items()}})
    except WrongResult as error:
        print(f"bench_allreduce: {error}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
    core.shutdown()
    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    size = MPI.COMM_WORLD.Get_size()
    raw_s = statistics.median(r["raw"] for r in rounds)
    report = {
        "device": "cuda", "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "model": args.model,
        "ranks": size, "tensors": len(in_bucket), "megabytes": round(bucket.nbytes / 1e6, 1), "rounds": args.rounds,
        "raw_nccl_ms": round(raw_s * 1e3, 3),
        "bus_bandwidth_gb_s": round(2 * (size - 1) / size * bucket.nbytes / raw_s / 1e9, 1) if size > 1 else None,
        "engine_ms": {k: round(statistics.median(r["engine"][k] for r in rounds) * 1e3, 3) for k in variants},
        "ratio_raw_over_engine": {k: round(statistics.median(r["ratio"][k] for r in rounds), 3) for k in variants},
        "ratio_by_round": {k: [round(r["ratio"][k], 3) for r in rounds] for k in variants},
    }
    print(f"{args.model} on {report['gpu']}: {len(in_bucket)} tensors, {report['megabytes']} MB, {size} ranks; "
          f"{args.rounds} rounds, each a median of {args.repeats} after {args.warmup} warm-up")
    print(f"  raw NCCL allreduce of the bucket:           {report['raw_nccl_ms']:8.3f} ms"
          + (f"   bus bandwidth {report['bus_bandwidth_gb_s']} GB/s" if size > 1 else ""))
    for key in variants:
        print(f"  engine, {key:<34} {report['engine_ms'][key]:8.3f} ms   raw/this = "
              f"{report['ratio_raw_over_engine'][key]:.3f}  (rounds: {report['ratio_by_round'][key]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
