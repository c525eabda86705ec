"""Adasum, the adaptive summation of Maleki et al. ("Scaling Distributed Training with Adaptive
Summation", MLSys 2021), as Horovod's MPI operation computes it.

Two gradients a and b combine, tensor by tensor, into
    (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b,
their sum where they are orthogonal and their average where they are equal. A power of two of
ranks combine in a binary tree: at level 1 ranks 2k and 2k+1, at level 2 those pairs' results,
and so on, the lower ranks' vector always the left operand, so every rank computes the same
result bit for bit.

The tree runs as vector halving, distance doubling: at each level a rank trades half of the
part it holds with its neighbour (its rank with the level's bit flipped) and combines the half
it keeps. The dot products and norms of a tensor are then spread over the ranks that hold its
pieces, so they are summed over the group of ranks that have combined so far (a communicator
per level) before the coefficients are taken. After the last level every rank holds 1/size of
the result, and one allgather gives each the whole. Each rank sends about twice the buffer in
all, as a ring allreduce does, where a plain tree would send it log2(size) times.
"""

import math

import numpy as np

ADASUM_DTYPES = ("float16", "float32", "float64")
# A squared norm below this is taken as zero: the tensor keeps coefficient 1 (Horovod's guard).
_NEGLIGIBLE_NORM_SQUARED = math.sqrt(np.finfo(np.float64).tiny)


def is_power_of_two(number):
    return number > 0 and number & (number - 1) == 0


def level_communicators(comm):
    """The communicators in which each level's dot products are summed: at level 2**i, the ranks
    whose rank agrees above bit i (those that have combined with each other by then). Making
    them is collective over `comm`."""
    size, rank = comm.Get_size(), comm.Get_rank()
    return [comm.Split(rank // (2 * level), rank) for level in _levels(size)]


def _levels(size):
    level = 1
    while level < size:
        yield level
        level *= 2


def _halves(start, stop, upper):
    """The part of [start, stop) a rank keeps and the part it sends at a level: the lower rank of
    the pair keeps the first half (the shorter one, where the length is odd)."""
    middle = start + (stop - start) // 2
    return ((middle, stop), (start, middle)) if upper else ((start, middle), (middle, stop))


def _shares(size, elements):
    """Where each rank's part of the result lies after the last level: (offsets, lengths)."""
    offsets, lengths = [], []
    for rank in range(size):
        start, stop = 0, elements
        for level in _levels(size):
            (start, stop), _ = _halves(start, stop, rank & level)
        offsets.append(start)
        lengths.append(stop - start)
    return offsets, lengths


def allreduce(comm, level_comms, buffer, tensor_sizes):
    """Adasum of the flat `buffer` (float16, float32 or float64; the concatenation of tensors of
    `tensor_sizes` elements each) over the ranks of `comm`, a power of two of them, in place.
    `level_comms`: level_communicators(comm)."""
    from mpi4py import MPI

    size, rank = comm.Get_size(), comm.Get_rank()
    bounds = np.cumsum([0, *tensor_sizes])
    received = np.empty_like(buffer)
    start, stop = 0, buffer.size
    for level, level_comm in zip(_levels(size), level_comms):
        upper = bool(rank & level)
        (start, stop), (send_start, send_stop) = _halves(start, stop, upper)
        comm.Sendrecv(buffer[send_start:send_stop].view(np.uint8), rank ^ level,
                      recvbuf=received[start:stop].view(np.uint8), source=rank ^ level)
        mine, theirs = buffer[start:stop], received[start:stop]
        left, right = (theirs, mine) if upper else (mine, theirs)
        pieces = _pieces(bounds, start, stop)
        # Per tensor: a.b, |a|^2, |b|^2 over this rank's piece, summed over the level's group
        products = np.zeros((len(tensor_sizes), 3))
        for tensor, piece_start, piece_stop in pieces:
            a = left[piece_start:piece_stop].astype(np.float64)
            b = right[piece_start:piece_stop].astype(np.float64)
            products[tensor] = np.dot(a, b), np.dot(a, a), np.dot(b, b)
        level_comm.Allreduce(MPI.IN_PLACE, products, MPI.SUM)
        for tensor, piece_start, piece_stop in pieces:
            dot, left_norm, right_norm = products[tensor]
            left_coefficient = 1.0 - dot / left_norm * 0.5 if left_norm >= _NEGLIGIBLE_NORM_SQUARED else 1.0
            right_coefficient = 1.0 - dot / right_norm * 0.5 if right_norm >= _NEGLIGIBLE_NORM_SQUARED else 1.0
            a = left[piece_start:piece_stop].astype(np.float64)
            a *= left_coefficient
            a += right_coefficient * right[piece_start:piece_stop].astype(np.float64)
            mine[piece_start:piece_stop] = a
    if size > 1:
        offsets, lengths = _shares(size, buffer.size)
        itemsize = buffer.itemsize
        comm.Allgatherv(MPI.IN_PLACE, [buffer.view(np.uint8), [n * itemsize for n in lengths],
                                       [o * itemsize for o in offsets], MPI.BYTE])


def _pieces(bounds, start, stop):
    """(tensor, piece start, piece stop) of each tensor's elements in [start, stop) of the
    buffer, the pieces' positions relative to `start`."""
    first = int(np.searchsorted(bounds, start, side="right")) - 1
    pieces = []
    for tensor in range(max(first, 0), len(bounds) - 1):
        low, high = max(bounds[tensor], start), min(bounds[tensor + 1], stop)
        if low >= stop:
            break
        if high > low:
            pieces.append((tensor, low - start, high - start))
    return pieces
