"""The engine's fixed cost per collective: the round trip of one small allreduce (submit, wait for
its result) against the transport's own call, on the CPU (MPI) or on a GPU (NCCL through CuPy).

    python scripts/bench_round_trip.py                    # one process; mpirun -np N for N ranks
    python scripts/bench_round_trip.py --device cuda      # a GPU a rank
    py-spy record --idle --threads --format raw -o trip.txt -- python scripts/bench_round_trip.py --device cuda
    python scripts/py_spy_summary.py trip.txt             # where each thread spends the round trip

Each round times --count round trips of the raw call, then as many of the engine's: an in-place
allreduce (Sum) of --elements float32 through hvdtrain.core, under the same name each time, as
training submits its gradients, and the wait for its result. On a GPU both run on a stream of
the caller's, which is synchronized before the clock is read, so a round trip ends when the
device has the result. Before each round trip the array is set to rank + 1 and after it checked
against the sum over the ranks, both outside the timed part: a wrong result stops the job.
Printed (rank 0): each round's median round trip of both, and as JSON the medians over the rounds
and the engine's extra time per collective (the median of the rounds' differences).
"""

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np


@dataclass
class Transport:
    """One rank's array and the two ways of reducing it in place: `raw`, the transport's own call,
    and `engine`, through hvdtrain.core; on a GPU, `stream`, the caller's stream both run on."""
    array: Any
    raw: Callable[[], None]
    engine: Callable[[], None]
    read_back: Callable[[], np.ndarray]
    stream: Optional[Any] = None
    close: Callable[[], None] = lambda: None


def transport(device, elements):
    from mpi4py import MPI

    from hvdtrain import core

    comm = MPI.COMM_WORLD
    if device == "cpu":
        array = np.empty(elements, np.float32)
        return Transport(array, lambda: comm.Allreduce(MPI.IN_PLACE, array, MPI.SUM),
                         lambda: core.allreduce_async(array, name="round_trip", op=core.ReduceOp.SUM).wait(),
                         lambda: array)
    import cupy
    from cupy.cuda import nccl

    cupy.cuda.Device(core.local_rank() % cupy.cuda.runtime.getDeviceCount()).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        array = cupy.empty(elements, np.float32)
    unique_id = comm.bcast(nccl.get_unique_id() if comm.Get_rank() == 0 else None, root=0)
    communicator = nccl.NcclCommunicator(comm.Get_size(), unique_id, comm.Get_rank())

    def raw():
        communicator.allReduce(array.data.ptr, array.data.ptr, elements, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()

    def engine():
        core.allreduce_async(array, name="round_trip", op=core.ReduceOp.SUM, stream=stream.ptr).wait(stream.ptr)
        stream.synchronize()

    return Transport(array, raw, engine, array.get, stream, communicator.destroy)


def median_round_trip(run, reduced, count, what):
    """The median time of `count` round trips of `run` on `reduced` (a Transport), each on freshly
    set inputs and checked."""
    from mpi4py import MPI

    from hvdtrain import core

    rank, size = core.rank(), core.size()
    expected = size * (size + 1) / 2
    times = []
    for _ in range(count):
        if reduced.stream is None:
            reduced.array.fill(rank + 1)
        else:
            with reduced.stream:
                reduced.array.fill(rank + 1)
            reduced.stream.synchronize()
        MPI.COMM_WORLD.Barrier()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
        result = reduced.read_back()
        if not (result == expected).all():
            wrong = int(np.argmax(result != expected))
            print(f"bench_round_trip: {what}: wrong result on rank {rank} at element {wrong}: {float(result[wrong])}, "
                  f"expected {expected}", file=sys.stderr, flush=True)
            MPI.COMM_WORLD.Abort(1)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--elements", type=int, default=1024, help="float32 elements reduced")
    parser.add_argument("--count", type=int, default=1000, help="round trips a round, of each")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from hvdtrain import core

    core.init()
    reduced = transport(args.device, args.elements)
    rounds = []
    for index in range(args.rounds):
        raw_s = median_round_trip(reduced.raw, reduced, args.count, "raw")
        engine_s = median_round_trip(reduced.engine, reduced, args.count, "engine")
        rounds.append((raw_s, engine_s))
        if core.rank() == 0:
            print(f"round {index + 1}: raw {raw_s * 1e6:.1f} us, engine {engine_s * 1e6:.1f} us", flush=True)
    reduced.close()
    if core.rank() == 0:
        print(json.dumps({
            "device": args.device, "ranks": core.size(), "elements": args.elements, "rounds": args.rounds,
            "count": args.count, "raw_us": round(statistics.median(r[0] for r in rounds) * 1e6, 1),
            "engine_us": round(statistics.median(r[1] for r in rounds) * 1e6, 1),
            "extra_us": round(statistics.median(r[1] - r[0] for r in rounds) * 1e6, 1)}))
    core.shutdown()


if __name__ == "__main__":
    main()
