"""Tensor fusion: how a batch of ready allreduces becomes a sequence of transport calls.

Measured on a 2-core host (README, "Measurements"): one 178 MB MPI allreduce takes about
three times as long as the same bytes in pieces of a few MiB, and a memcpy of those bytes
costs half as much as reducing them. So the plan
- reduces each large tensor where it lies (no copy), in pieces of about `chunk_bytes`;
- packs small tensors together into the fusion buffer, a window of at most `chunk_bytes`
  (and at most `HOROVOD_FUSION_THRESHOLD`), so that many tiny tensors cost one call.
The plan depends only on sizes that every rank agreed on, so every rank makes the same calls.
"""

import functools
from dataclasses import dataclass
from typing import Tuple, Union


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
