"""What scripts/calibrate_scaling.py runs on its network-namespace hosts, one job a call:

    python scripts/calibration_jobs.py JOB SPEC_JSON OUTPUT

- `link_server` / `link_client`: the TCP probe of one link, a server on one host and a client on
  another: one-byte round trips (the link's own latency), then one stream for `seconds` (what
  the shaped link carries). The server says "listening" on stdout once it does.
- `allreduce` (every rank, under mpirun): the engine's allreduce of one float32 tensor of each
  size, timed as scripts/bench_allreduce.py times it (a median of repeats after warm-up, every
  rank starting together, every result checked), in rounds that rotate the order of the sizes;
  rank 0 writes rank 0's median over the rounds of each size.
- `training` (every rank, under mpirun): the recipe's model, optimizer and per-worker batch
  (config.yaml as `hvdtrain` composes it), trained in rounds of two phases: each rank alone (a
  copy of the model with the plain optimizer: every rank computes at once, nothing is
  communicated) and data-parallel (through hvdtrain.torch's DistributedOptimizer). A phase is timed from a barrier of
  all ranks to the next, so the alone phase gives the compute time of a step with as many ranks
  sharing this machine's cores as the data-parallel phase has. Rank 0 writes both per round,
  each with the forward, backward and update seconds of a step (averaged over the ranks): in
  the data-parallel phase the update includes the wait for what backward did not hide. Then
  the overlap phase: the alone model's forward and backward while a thread reduces one step's
  gradient bytes (in one buffer, through the engine) a few times, and those allreduces again
  with nothing computing: how much slower each ran beside the other.
OUTPUT is a JSON file (the first host sees this machine's files); SPEC_JSON the job's arguments.
"""

import json
import math
import socket
import statistics
import sys
import threading
import time

import numpy as np

import bench_allreduce

PROBE_PORT = 5201
# Small allreduces take milliseconds and vary the most (a thread that waits for a core shows in
# full): up to 8 times as many repeats below this size, in about the time of one large one.
SMALL_ALLREDUCE_BYTES = 1 << 20
ROUND_TRIPS = 200
STREAM_CHUNK_BYTES = 1 << 20


def link_server(spec, output):
    with socket.create_server((spec["address"], PROBE_PORT)) as server:
        print("listening", flush=True)
        with server.accept()[0] as echo:  # round trips: every byte back at once
            echo.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := echo.recv(64):
                echo.sendall(data)
        with server.accept()[0] as sink:  # the stream, until the client has sent everything
            chunk = bytearray(STREAM_CHUNK_BYTES)
            while sink.recv_into(chunk):
                pass


def link_client(spec, output):
    with socket.create_connection((spec["address"], PROBE_PORT)) as echo:
        echo.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        round_trips = []
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter()
            echo.sendall(b"x")
            echo.recv(1)
            round_trips.append(time.perf_counter() - started)
    with socket.create_connection((spec["address"], PROBE_PORT)) as stream:
        chunk, sent = bytes(STREAM_CHUNK_BYTES), 0
        started = time.perf_counter()
        while time.perf_counter() - started < spec["seconds"]:
            stream.sendall(chunk)
            sent += len(chunk)
        stream.shutdown(socket.SHUT_WR)
        stream.recv(1)  # the server closes once it has read the last byte
        elapsed = time.perf_counter() - started
    write(output, {"round_trip_us": statistics.median(round_trips) * 1e6, "tcp_gbps": sent * 8 / elapsed / 1e9})


def allreduce(spec, output):
    from hvdtrain import core

    core.init()
    sizes = spec["sizes"]
    seconds = {nbytes: [] for nbytes in sizes}
    try:
        for index in range(spec["rounds"]):
            start = index % len(sizes)
            for nbytes in sizes[start:] + sizes[:start]:
                tensor = np.empty(nbytes // 4, np.float32)
                work = bench_allreduce.workload([("tensor", tensor)], bench_allreduce.pattern(tensor.size))

                def run():
                    core.allreduce_async(tensor, name=f"calibration.{nbytes}", op=core.ReduceOp.SUM).wait()

                repeats = spec["repeats"] * min(8, max(1, SMALL_ALLREDUCE_BYTES // nbytes))
                seconds[nbytes].append(bench_allreduce.median_time(
                    run, work, False, f"allreduce of {nbytes} bytes", spec["warmup"], repeats, core.barrier))
    except bench_allreduce.WrongResult as error:
        from mpi4py import MPI

        print(f"calibration_jobs: {error}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
    if core.rank() == 0:
        write(output, {"ranks": core.size(),
                       "seconds": [[nbytes, statistics.median(seconds[nbytes])] for nbytes in sizes]})
    core.shutdown()


def training(spec, output):
    import hvdtrain.torch as hvd  # first: it sets what Open MPI reads when mpi4py starts it
    import torch
    from mpi4py import MPI

    from hvdtrain import core as hvd_core
    from hvdtrain.run.run_dir import load_run_config
    from hvdtrain.scaling.prediction import gradient_sizes
    from hvdtrain.scaling.profile import timed_step
    from hvdtrain.tasks.data_torch import build_datasets
    from hvdtrain.tasks.models_torch import build_model
    from hvdtrain.training.train_torch import build_optimizer

    cfg = load_run_config(spec["config"])
    hvd.init()
    world = MPI.COMM_WORLD
    torch.manual_seed(cfg.train.seed)
    train_set, _ = build_datasets(cfg.data, cfg.model.num_classes, cfg.train.seed)
    samples = [train_set[(index, cfg.train.seed)] for index in range(cfg.train.batch_size)]  # keys: (index, seed)
    inputs = torch.stack([sample for sample, _ in samples])
    labels = torch.as_tensor([label for _, label in samples])

    # Two copies of the model: DistributedOptimizer's hooks reduce every gradient that backward
    # makes, so the alone phase needs a model of its own.
    alone_model, parallel_model = build_model(cfg.model), build_model(cfg.model)
    phases = {
        "alone": (alone_model, build_optimizer(alone_model, cfg.optimizer, cfg.optimizer.base_lr)),
        "parallel": (parallel_model, hvd.DistributedOptimizer(
            build_optimizer(parallel_model, cfg.optimizer, cfg.optimizer.base_lr),
            named_parameters=parallel_model.named_parameters(), op=hvd.Average)),
    }
    hvd.broadcast_parameters(parallel_model.state_dict(), root_rank=0)

    def phase(model_and_optimizer, steps):
        """Seconds a step from barrier to barrier, and the parts of a step averaged over its
        steps and the ranks."""
        world.Barrier()
        started = time.perf_counter()
        timed = [timed_step(*model_and_optimizer, inputs, labels) for _ in range(steps)]
        parts = [sum(times) / steps for times in zip(*timed)]
        world.Barrier()
        elapsed = (time.perf_counter() - started) / steps
        forward_s, backward_s, update_s = (float(mean) for mean in np.mean(world.allgather(parts), axis=0))
        return {"step_s": elapsed, "forward_s": forward_s, "backward_s": backward_s, "update_s": update_s}

    # One step's gradients in one buffer: what the overlap phase reduces while backward runs.
    gradients = np.ones(sum(gradient_sizes(parallel_model)) // 4, np.float32)

    def reduce_gradients(count):
        """Seconds of `count` allreduces of the gradients' bytes, one after another."""
        started = time.perf_counter()
        for _ in range(count):
            hvd_core.allreduce_async(gradients, name="calibration.overlap", op=hvd_core.ReduceOp.SUM).wait()
        return time.perf_counter() - started

    def overlap(alone, least_allreduces):
        """The alone model's forward and backward, while a thread reduces the gradients' bytes
        (at least `least_allreduces` times, and for at least 3 steps), and the same allreduces
        with nothing computing: how much slower each runs beside the other (averaged over the
        ranks)."""
        world.Barrier()
        one_s = reduce_gradients(1)
        compute_s = alone["forward_s"] + alone["backward_s"]
        allreduces = world.allreduce(max(least_allreduces, math.ceil(3 * compute_s / one_s)), op=MPI.MAX)
        world.Barrier()
        together = {}
        thread = threading.Thread(target=lambda: together.update(seconds=reduce_gradients(allreduces)))
        thread.start()
        computing = []  # the steps that the allreduces overlapped from end to end
        while True:
            forward_s, backward_s, _ = timed_step(*phases["alone"], inputs, labels)
            if not thread.is_alive():
                # A model so small that the allreduces outran its first step: that step it is.
                computing = computing or [forward_s + backward_s]
                break
            computing.append(forward_s + backward_s)
        thread.join()
        world.Barrier()
        reduce_alone_s = reduce_gradients(allreduces)
        compute_slowdown = statistics.mean(computing) / compute_s
        slowdowns = np.mean(world.allgather([compute_slowdown, together["seconds"] / reduce_alone_s]), axis=0)
        return {"compute_slowdown": float(slowdowns[0]), "communication_slowdown": float(slowdowns[1]),
                "steps_overlapped": len(computing)}

    for _ in range(spec["warmup"]):
        for model_and_optimizer in phases.values():
            timed_step(*model_and_optimizer, inputs, labels)
    rounds = []
    for index in range(spec["rounds"]):
        # Alternating which phase goes first keeps a drift of the machine's speed from favouring one.
        order = ("alone", "parallel") if index % 2 == 0 else ("parallel", "alone")
        measured = {name: phase(phases[name], spec["steps"]) for name in order}
        measured["overlap"] = overlap(measured["alone"], spec["overlap_allreduces"])
        rounds.append(measured)
    if world.Get_rank() == 0:
        write(output, {"ranks": world.Get_size(), "samples_per_step": cfg.train.batch_size,
                       "gradient_bytes": list(gradient_sizes(parallel_model)),
                       "threads_per_rank": torch.get_num_threads(), "rounds": rounds})
    hvd.shutdown()


def write(path, result):
    with open(path, "w") as file:
        json.dump(result, file)


JOBS = {job.__name__: job for job in (link_server, link_client, allreduce, training)}

if __name__ == "__main__":
    job, spec, output = sys.argv[1:]
    JOBS[job](json.loads(spec), output)
