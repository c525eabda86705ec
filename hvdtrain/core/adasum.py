"""Adasum, the adaptive summation of Maleki et al. ("Scaling Distributed Training with Adaptive
Summation", MLSys 2021), as Horovod's MPI operation computes it.

Two gradients a and b combine, tensor by tensor, into
    (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b,
their sum where they are orthogonal and their average where they are equal. A power of two of
ranks combine in a binary tree: at level 1 ranks 2k and 2k+1, at level 2 those pairs' results,
and so on, the lower ranks' vector always the left operand, as in Horovod.

The tree runs as vector halving, distance doubling: at each level a rank trades half of the
part it holds with its neighbour (its rank with the level's bit flipped) and combines the half
it keeps. The dot products and norms of a tensor are then spread over the ranks that hold its
pieces, so they are summed over the group of ranks that have combined so far (a communicator
per level) before the coefficients are taken. After the last level every rank holds 1/size of
the result, and an allgather gives each the whole: every element is combined on one rank, so
all ranks end with the same bits. Each rank sends about twice the buffer in
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


def allreduce(comm, level_comms, buffer, tensor_sizes, chunk_elements):
    """Adasum of the flat `buffer` (float16, float32 or float64; the concatenation of tensors of
    `tensor_sizes` elements each) over the ranks of `comm`, a power of two of them, in place.
    `level_comms`: level_communicators(comm). Everything moves and is computed in pieces of at
    most `chunk_elements`: MPI moves large buffers faster in pieces, as the plain allreduce does
    (mpi_backend.py), and what is computed of a piece stays in cache."""
    from mpi4py import MPI

    size, rank = comm.Get_size(), comm.Get_rank()
    # 16- and 32-bit floats are combined in float32, as Horovod's vectorized code does for float16.
    # The dot products of a piece are taken in that type too, and summed in float64 over the
    # pieces, which keeps them within about 1e-8 of float64's (pieces of 1 MiB, measured).
    compute = np.float64 if buffer.dtype == np.float64 else np.float32
    bounds = np.cumsum([0, *tensor_sizes])
    received = np.empty_like(buffer)
    start, stop = 0, buffer.size
    for level, level_comm in zip(_levels(size), level_comms):
        upper = bool(rank & level)
        (start, stop), (send_start, send_stop) = _halves(start, stop, upper)
        _exchange(comm, buffer[send_start:send_stop], received[start:stop], rank ^ level, chunk_elements)
        mine, theirs = buffer[start:stop], received[start:stop]
        left, right = (theirs, mine) if upper else (mine, theirs)
        pieces = _pieces(bounds, start, stop, chunk_elements)
        # Per tensor: a.b, |a|^2, |b|^2 over this rank's pieces, summed over the level's group
        products = np.zeros((len(tensor_sizes), 3))
        for tensor, piece_start, piece_stop in pieces:
            a = left[piece_start:piece_stop].astype(compute, copy=False)
            b = right[piece_start:piece_stop].astype(compute, copy=False)
            products[tensor] += float(np.dot(a, b)), float(np.dot(a, a)), float(np.dot(b, b))
        level_comm.Allreduce(MPI.IN_PLACE, products, MPI.SUM)
        dot, left_norm, right_norm = products.T
        with np.errstate(divide="ignore", invalid="ignore"):
            left_coefficients = np.where(left_norm >= _NEGLIGIBLE_NORM_SQUARED, 1.0 - dot / left_norm * 0.5, 1.0)
            right_coefficients = np.where(right_norm >= _NEGLIGIBLE_NORM_SQUARED, 1.0 - dot / right_norm * 0.5, 1.0)
        own_coefficients, other_coefficients = ((right_coefficients, left_coefficients) if upper
                                                else (left_coefficients, right_coefficients))
        for tensor, piece_start, piece_stop in pieces:
            own, other = mine[piece_start:piece_stop], theirs[piece_start:piece_stop]
            if buffer.dtype == compute:  # in place (each rank combines a part of its own)
                own *= compute(own_coefficients[tensor])
                own += compute(other_coefficients[tensor]) * other
            else:
                combined = np.multiply(own, compute(own_coefficients[tensor]), dtype=compute)
                combined += compute(other_coefficients[tensor]) * other
                own[...] = combined
    if size > 1:
        _gather_shares(comm, buffer, chunk_elements)


def _exchange(comm, send, receive, neighbor, chunk_elements):
    """Send `send` to `neighbor` and receive its part into `receive`, piece by piece. The two
    differ in length by one element at most, and both ranks make as many calls (a call may
    move nothing one way)."""
    for offset in range(0, max(send.size, receive.size), chunk_elements):
        piece = slice(offset, offset + chunk_elements)
        comm.Sendrecv(send[piece].view(np.uint8), neighbor, recvbuf=receive[piece].view(np.uint8), source=neighbor)


def _gather_shares(comm, buffer, chunk_elements):
    """Every rank's part of the result into every rank's buffer: an allgather of each part's
    first piece, then of each part's second, and so on."""
    from mpi4py import MPI

    offsets, lengths = _shares(comm.Get_size(), buffer.size)
    itemsize, whole = buffer.itemsize, buffer.view(np.uint8)
    for offset in range(0, max(lengths), chunk_elements):
        counts = [max(0, min(chunk_elements, length - offset)) * itemsize for length in lengths]
        places = [min(start + offset, buffer.size) * itemsize for start in offsets]
        comm.Allgatherv(MPI.IN_PLACE, [whole, counts, places, MPI.BYTE])


def _pieces(bounds, start, stop, chunk_elements):
    """(tensor, piece start, piece stop) of each tensor's elements in [start, stop) of the
    buffer, in pieces of at most `chunk_elements`, their positions relative to `start`."""
    first = int(np.searchsorted(bounds, start, side="right")) - 1
    pieces = []
    for tensor in range(max(first, 0), len(bounds) - 1):
        low, high = max(bounds[tensor], start), min(bounds[tensor + 1], stop)
        if low >= stop:
            break
        pieces.extend((tensor, piece - start, min(piece + chunk_elements, high) - start)
                      for piece in range(low, high, chunk_elements))
    return pieces
