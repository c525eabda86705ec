"""How fast data-parallel training runs on a cluster: the time of one step, predicted.

A step of data-parallel training costs one device's compute (forward, backward, update) plus
the part of the gradient allreduce that backward does not hide. The allreduce is modelled as
the engine runs it:

- Gradients become ready one after another during backward, in the order backward produces
  them (the model's last layer first). Without per-layer costs, each gradient tensor is taken
  to cost an equal share of backward. hvdtrain.torch's optimizer submits them in segments
  (HVDTRAIN_SEGMENT_BYTES; 0 for Horovod's way, each on its own), which the model plans with the
  optimizer's own planner (hvdtrain/core/fusion.py, plan_segments): a segment is ready for the
  engine when its last gradient is.
- The engine works in cycles (HOROVOD_CYCLE_TIME): woken by a ready gradient, it collects for
  one cycle time, or until it has finished the previous cycle's reductions, whichever is later;
  then it fuses every ready gradient, in order, into buffers of at most
  HOROVOD_FUSION_THRESHOLD bytes (a larger tensor goes alone) and reduces them one after
  another, as the engine's own planner (fusion.plan_batches) batches them.
- A buffer of B bytes over N ranks costs a ring allreduce: 2(N-1) steps, each moving B/N bytes
  over a link and paying its latency once, so 2(N-1)/N * B / bandwidth + 2(N-1) * latency.
  In a flat ring over hosts x slots every step waits for the slowest link the ring crosses
  (each host is entered and left once, so a host's uplink carries what one rank sends), as NCCL
  reduces GPUs; the hierarchical variant (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE; in bytes on
  each link, Open MPI's han, which reduces CPU ranks: HIERARCHICAL) reduce-scatters within each
  host, has each rank allreduce its 1/slots of the data across hosts, all of a host's ranks at
  once through its one link, and allgathers within the host; a reduce-scatter followed by an
  allgather costs exactly one ring allreduce.
- What is still being reduced when backward ends is exposed: step = compute + exposed.
- Overlap may not be free: where compute and communication share a resource (CPU ranks whose
  cores also move and reduce the bytes), backward runs `compute_slowdown` times slower while a
  reduction runs, and a reduction `communication_slowdown` times slower while backward runs.
  Both are measured, side by side, not fitted (scripts/calibrate_scaling.py); 1 for devices
  that compute while the network moves the bytes.

Framework-free (plain numbers); prediction.py feeds it a model's gradient sizes, a measured or
published single-device throughput and the cluster's links.
"""

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Tuple

from hvdtrain.core.fusion import plan_batches, plan_segments
from hvdtrain.core.settings import Settings

# Every gradient of the model is of one dtype on one device: one bucket, and one fusion key.
ONE_KEY = 0

# Backward computes, for each layer, the gradient of its input and of its weights, each about
# as costly as the layer's forward: 2/3 of forward + backward (the optimizer's update is a
# small part of a step for these models). Assumed where no profile has measured it.
DEFAULT_BACKWARD_FRACTION = 2 / 3


@dataclass(frozen=True)
class Link:
    """One kind of link: between hosts, or between the ranks of one host."""

    gbps: float  # bandwidth, Gbit/s (10**9 bits/s)
    latency_us: float  # paid once per step of a ring

    def transfer_s(self, nbytes):
        return nbytes * 8 / (self.gbps * 1e9)


@dataclass(frozen=True)
class Network:
    across: Link  # between hosts
    within: Link  # between the ranks of one host


# The links between the ranks of one host where nothing else is known, by the device they train on:
# - cuda: PCIe 3.0 x16, the slot of a GPU without NVLink: 8 GT/s x 16 lanes x 128/130 encoding =
#   126 Gbit/s each way (PCI-SIG, PCIe 3.0); a step 5.7 us (NCCL 2.5.6, hwLat[PCI][Ring][Simple]).
#   GPUs joined by NVLink are faster: set cluster.network.within_gbps.
# - cpu: MPI over shared memory as measured on this project's 2-core machine (scripts/
#   bench_allreduce.py: Open MPI's allreduce of 178 MB between 2 ranks in 28 ms, B / t =
#   51 Gbit/s); a step 1 us, assumed (a cache-line handoff between cores plus MPI's call).
PCIE3_X16 = Link(gbps=126.0, latency_us=5.7)
SHARED_MEMORY = Link(gbps=51.0, latency_us=1.0)
WITHIN_HOST = {"cuda": PCIE3_X16, "cpu": SHARED_MEMORY}
# Whether the ranks of several hosts of several ranks each reduce hierarchically, by the device
# they train on. CPU ranks: Open MPI's han component reduces within each host, allreduces among
# one rank per host and broadcasts within, so each host's link carries the buffer once each way
# (the calibration's 2 x 2 layouts, scripts/calibrate_scaling.py: within 10 % modelled so, 10-31 %
# off as one flat ring).
# GPUs: NCCL's rings, which cross each host's link once per ring.
HIERARCHICAL = {"cuda": False, "cpu": True}


@dataclass(frozen=True)
class Workload:
    """One device's training step."""

    samples_per_step: int  # per-worker batch
    compute_s: float  # forward + backward + update of one step on one device, no communication
    backward_fraction: float  # the share of compute_s that is backward: the window the allreduce can hide in
    gradient_bytes: Tuple[int, ...]  # per-tensor gradient sizes in the order backward produces them


@dataclass(frozen=True)
class Overlap:
    """How much backward and the allreduce slow each other while both run (1: not at all)."""

    compute_slowdown: float = 1.0
    communication_slowdown: float = 1.0


INDEPENDENT = Overlap()


def ring_allreduce_s(nbytes, ranks, link):
    """Seconds of a ring allreduce of `nbytes` over `ranks` ranks joined by `link`."""
    steps = 2 * (ranks - 1)
    if steps <= 0:
        return 0.0
    return steps / ranks * link.transfer_s(nbytes) + steps * link.latency_us * 1e-6


def allreduce_s(nbytes, hosts, slots, network, hierarchical=False):
    """Seconds of one allreduce of `nbytes` over `hosts` hosts of `slots` ranks each."""
    if hierarchical:
        # The host's `slots` rings across hosts, 1/slots of the data each, run at once through
        # its one link: together they take the time of a ring over the whole buffer.
        return (ring_allreduce_s(nbytes, slots, network.within)
                + ring_allreduce_s(nbytes, hosts, network.across))
    crossed = [link for link, used in ((network.across, hosts > 1), (network.within, slots > 1)) if used]
    if not crossed:
        return 0.0
    slowest = Link(min(link.gbps for link in crossed), max(link.latency_us for link in crossed))
    return ring_allreduce_s(nbytes, hosts * slots, slowest)


def step_s(workload, hosts, slots, network, fusion_threshold_bytes=None, cycle_time_s=None, segment_bytes=None,
           hierarchical=False, overlap=INDEPENDENT):
    """Seconds of one training step on every rank of `hosts` x `slots` (see the module's doc).
    The engine's and the optimizer's settings default to hvdtrain's
    (hvdtrain.core.settings.Settings)."""
    if fusion_threshold_bytes is None:
        fusion_threshold_bytes = Settings.fusion_threshold_bytes
    if cycle_time_s is None:
        cycle_time_s = Settings.cycle_time_s
    if segment_bytes is None:
        segment_bytes = Settings.segment_bytes
    if hosts * slots == 1:
        return workload.compute_s  # one rank reduces nothing, as Horovod's DistributedOptimizer
    backward_s = workload.backward_fraction * workload.compute_s
    gradients = workload.gradient_bytes
    runs = plan_segments([(ONE_KEY, nbytes) for nbytes in gradients], segment_bytes)
    sizes = [sum(gradients[i] for i in run) for run in runs]
    # backward's progress when each segment's last gradient is ready
    last = list(itertools.accumulate(len(run) for run in runs))
    ready = [backward_s * count / last[-1] for count in last]
    # Simulated in wall time from backward's start, from one event to the next (a gradient
    # ready, the engine's cycle starting, its reductions done), with backward's and the
    # reductions' rates constant in between.
    now = progress = 0.0  # progress: seconds of backward alone done so far
    ready_at = []  # wall time at which each gradient was ready
    taken = 0  # gradients the engine has taken into a cycle
    reducing_left = 0.0  # seconds (alone) of the current cycle's reductions still to do
    while True:
        while len(ready_at) < len(sizes) and ready[len(ready_at)] <= progress:
            ready_at.append(now)
        computing, reducing = len(ready_at) < len(sizes), reducing_left > 0  # backward ends with its last gradient
        cycle_start = ready_at[taken] + cycle_time_s if not reducing and taken < len(ready_at) else math.inf
        if cycle_start <= now:
            reducing_left = sum(allreduce_s(nbytes, hosts, slots, network, hierarchical)
                                for nbytes in fused_buffers(sizes[taken:len(ready_at)], fusion_threshold_bytes))
            taken = len(ready_at)
            continue
        if not computing and not reducing and taken == len(sizes):
            break
        compute_rate = 1 / overlap.compute_slowdown if reducing else 1.0
        reduce_rate = 1 / overlap.communication_slowdown if computing else 1.0
        to_gradient = (ready[len(ready_at)] - progress) / compute_rate if computing else math.inf
        to_reduced = reducing_left / reduce_rate if reducing else math.inf
        step = min(cycle_start - now, to_gradient, to_reduced)
        now += step
        # The event that ends the step lands exactly: rounding must not leave it a hair short.
        if computing:
            progress = ready[len(ready_at)] if step == to_gradient else min(progress + step * compute_rate,
                                                                             ready[len(ready_at)])
        if reducing:
            reducing_left = 0.0 if step == to_reduced else reducing_left - step * reduce_rate
    return workload.compute_s - backward_s + now


def fused_buffers(sizes, fusion_threshold_bytes):
    """The bytes of each buffer that tensors of `sizes`, ready together, are fused into, in the
    order the engine reduces them."""
    batches = plan_batches([(ONE_KEY, nbytes) for nbytes in sizes], fusion_threshold_bytes)
    return [sum(sizes[i] for i in batch) for batch in batches]


def efficiency(workload, hosts, slots, network, **engine):
    """The fraction of its compute speed each device keeps: compute / step time."""
    return workload.compute_s / step_s(workload, hosts, slots, network, **engine)


def samples_per_s(workload, hosts, slots, network, **engine):
    """The whole job's training throughput."""
    return hosts * slots * workload.samples_per_step / step_s(workload, hosts, slots, network, **engine)


def fit_link(measurements: Iterable[Tuple[int, float, float]]) -> Link:
    """The Link whose ring formula best fits flat ring allreduces measured as (ranks, nbytes,
    seconds): least squares of the relative error, so that the small messages, which carry
    the latency, count as much as the large ones, with bandwidth and latency kept >= 0."""
    # seconds = per_bit * (2(N-1)/N * bits) + latency * 2(N-1): linear in (per_bit, latency).
    rows = [(2 * (ranks - 1) / ranks * nbytes * 8 / seconds, 2 * (ranks - 1) / seconds)
            for ranks, nbytes, seconds in measurements if ranks > 1]
    if len(rows) < 2:
        raise ValueError("fit_link needs at least two allreduces over more than one rank")
    suu = sum(u * u for u, _ in rows)
    suv = sum(u * v for u, v in rows)
    svv = sum(v * v for _, v in rows)
    su, sv = sum(u for u, _ in rows), sum(v for _, v in rows)
    determinant = suu * svv - suv * suv
    if determinant <= 1e-9 * suu * svv:
        raise ValueError("fit_link cannot tell bandwidth from latency: measure allreduces of more than one size")
    per_bit = (su * svv - sv * suv) / determinant
    latency = (sv * suu - su * suv) / determinant
    if per_bit < 0 or latency < 0:
        # The best fit lies on the boundary: one of the two terms is zero. Minimise
        # sum((1 - a*u - b*v)**2) along each axis and keep the better one.
        candidates = [(su / suu, 0.0), (0.0, sv / svv)]
        per_bit, latency = min(candidates, key=lambda ab: sum((1 - ab[0] * u - ab[1] * v) ** 2 for u, v in rows))
    return Link(gbps=math.inf if per_bit == 0 else 1e-9 / per_bit, latency_us=latency * 1e6)
