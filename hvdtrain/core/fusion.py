"""Tensor fusion: which gradients go to the engine together, which ready allreduces run as one
fused batch, and how a batch becomes a sequence of transport calls.

The first two are pure functions of keys and sizes (no torch, no MPI), so that a model of a
step's communication (the scaling model) can plan exactly as the code it models does:
- plan_segments: the DistributedOptimizer's segments, runs of gradients that go to the engine
  as one submission;
- plan_batches: the engine's batches of the allreduces that are ready in one cycle.

A batch's transport calls (plan_allreduce): measured on a 2-core host (docs/benchmarks.md), one
178 MB MPI allreduce takes about three times as long as the same bytes in pieces of a few MiB,
and a memcpy of those bytes costs half as much as reducing them. So the plan
- reduces each large tensor where it lies (no copy), in pieces of about `chunk_bytes`;
- packs small tensors together into the fusion buffer, a window of at most `chunk_bytes`
  (and at most `HOROVOD_FUSION_THRESHOLD`), so that many tiny tensors cost one call.
The plan depends only on sizes that every rank agreed on, so every rank makes the same calls.
"""

import functools
from dataclasses import dataclass
from typing import Hashable, List, Optional, Sequence, Tuple, Union


@dataclass(frozen=True)
class Piece:
    """Reduce elements [start, stop) of tensor `index` in its own memory."""

    index: int
    start: int
    stop: int


@dataclass(frozen=True)
class Pack:
    """Copy whole tensors `indices` into the fusion buffer, reduce it once, copy them back."""

    indices: Tuple[int, ...]
    elements: int


Step = Union[Piece, Pack]


def plan_segments(gradients: Sequence[Tuple[Optional[Hashable], int]], segment_bytes: int) -> List[List[int]]:
    """The optimizer's segments: `gradients` are (bucket key, nbytes) in the order backward
    produces them, with None for a gradient outside the buckets; each segment is a list of
    positions in `gradients`. A segment keeps to one bucket and is closed once it holds
    `segment_bytes` or more (0: each gradient on its own); a gradient outside the buckets is
    submitted on its own, so it is a segment of its own."""
    segments, current, current_bucket, current_bytes = [], [], None, 0
    for position, (bucket, nbytes) in enumerate(gradients):
        if current and (bucket is None or bucket != current_bucket or current_bytes >= segment_bytes):
            segments.append(current)
            current, current_bytes = [], 0
        current.append(position)
        current_bucket = bucket
        current_bytes += nbytes
    if current:
        segments.append(current)
    return segments


def plan_batches(ready: Sequence[Tuple[Optional[Hashable], int]], threshold_bytes: int) -> List[List[int]]:
    """The engine's fused batches: `ready` holds (fusion key, nbytes) of each collective ready in
    one cycle, in the agreed order, and each batch is a list of positions in it, listed in the
    order the batches run. Allreduces of one key fill a batch until the next one would take it
    past `threshold_bytes` (0: no fusion; one larger than the threshold goes alone): the full
    batch runs then, before that allreduce, which opens the next batch of its key; the batches
    still open at the end run last, in the order their keys first came. Key None marks what is
    not fused (another collective, an error): it runs alone, in its place among the batches."""
    batches = []
    open_batches = {}  # fusion key -> (positions, bytes), in the order the keys first came
    for position, (key, nbytes) in enumerate(ready):
        if key is None:
            batches.append([position])
            continue
        batch, batch_bytes = open_batches.get(key, ([], 0))
        if batch and (threshold_bytes == 0 or batch_bytes + nbytes > threshold_bytes):
            batches.append(batch)
            batch, batch_bytes = [], 0
        batch.append(position)
        open_batches[key] = (batch, batch_bytes + nbytes)
    batches.extend(batch for batch, _ in open_batches.values())
    return batches


def pack_capacity_bytes(settings):
    """Bytes the fusion buffer must hold; 0 when fusion is off."""
    if settings.fusion_threshold_bytes == 0:
        return 0
    return min(settings.chunk_bytes, settings.fusion_threshold_bytes)


@functools.lru_cache(maxsize=256)
def plan_allreduce(sizes: Tuple[int, ...], itemsize: int, chunk_bytes: int, pack_below_bytes: int,
                   capacity_bytes: int) -> Tuple[Step, ...]:
    """The steps that reduce tensors of `sizes` elements. Pure, so the plan of a batch that
    recurs every training step is computed once."""
    chunk_elements = max(1, chunk_bytes // itemsize)
    capacity_elements = capacity_bytes // itemsize
    steps = []
    packed, packed_elements = [], 0
    for index, elements in enumerate(sizes):
        nbytes = elements * itemsize
        if capacity_elements and nbytes < pack_below_bytes and elements <= capacity_elements:
            if packed_elements + elements > capacity_elements:
                steps.append(Pack(tuple(packed), packed_elements))
                packed, packed_elements = [], 0
            packed.append(index)
            packed_elements += elements
            continue
        pieces = max(1, -(-elements // chunk_elements))
        bounds = [elements * j // pieces for j in range(pieces + 1)]
        steps.extend(Piece(index, bounds[j], bounds[j + 1]) for j in range(pieces))
    if packed:
        steps.append(Pack(tuple(packed), packed_elements))
    return tuple(steps)
