"""The fusion plan, checked on many random batches: every element is reduced exactly once,
pieces fit the chunk, packs fit the fusion buffer, and with fusion off nothing is packed."""

import random

from hvdtrain.core.fusion import Pack, Piece, pack_capacity_bytes, plan_allreduce
from hvdtrain.core.settings import Settings


def random_batches(count=300):
    rng = random.Random(0)
    for _ in range(count):
        itemsize = rng.choice((1, 2, 4, 8))
        sizes = tuple(rng.choice((0, 1, rng.randrange(2, 100), rng.randrange(100, 5000), rng.randrange(5000, 20000)))
                      for _ in range(rng.randrange(1, 30)))
        chunk_bytes = rng.choice((256, 1000, 16384, 4 << 20))
        pack_below_bytes = rng.choice((0, 64, 4096, 65536, 1 << 30))
        capacity_bytes = rng.choice((0, 0, 7, 1024, 16384, 4 << 20))
        yield sizes, itemsize, chunk_bytes, pack_below_bytes, capacity_bytes


def check_plan(sizes, itemsize, chunk_bytes, pack_below_bytes, capacity_bytes):
    plan = plan_allreduce(sizes, itemsize, chunk_bytes, pack_below_bytes, capacity_bytes)
    covered = [[] for _ in sizes]  # (start, stop) ranges reduced, per tensor
    for step in plan:
        if isinstance(step, Pack):
            assert capacity_bytes > 0, "fusion is off, yet tensors were packed"
            assert step.elements == sum(sizes[i] for i in step.indices)
            assert step.elements * itemsize <= capacity_bytes
            for i in step.indices:
                assert sizes[i] * itemsize < pack_below_bytes
                covered[i].append((0, sizes[i]))
        else:
            assert isinstance(step, Piece)
            assert 0 <= step.start <= step.stop <= sizes[step.index]
            assert step.stop - step.start <= max(1, chunk_bytes // itemsize)
            covered[step.index].append((step.start, step.stop))
    for i, ranges in enumerate(covered):
        ranges.sort()
        assert ranges, f"tensor {i} is never reduced"
        assert ranges[0][0] == 0 and ranges[-1][1] == sizes[i], (i, ranges)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), f"tensor {i}: gaps or overlaps {ranges}"
        assert len(ranges) == 1 or all(stop > start for start, stop in ranges), f"tensor {i}: empty pieces {ranges}"


def test_plan_reduces_every_element_once_within_the_limits():
    for batch in random_batches():
        try:
            check_plan(*batch)
        except AssertionError as failure:
            raise AssertionError(f"plan_allreduce{batch}: {failure}") from None


def test_small_tensors_share_one_pack_and_large_ones_go_in_pieces():
    plan = plan_allreduce((10, 20, 1000, 30), 4, 1024, 200, 1024)
    assert plan == (Piece(2, 0, 250), Piece(2, 250, 500), Piece(2, 500, 750), Piece(2, 750, 1000),
                    Pack((0, 1, 3), 60))


def test_a_chunk_smaller_than_an_element_still_makes_progress():
    assert plan_allreduce((3,), 8, 5, 0, 0) == (Piece(0, 0, 1), Piece(0, 1, 2), Piece(0, 2, 3))


def test_pack_capacity_is_the_smaller_of_chunk_and_threshold_and_zero_turns_fusion_off():
    assert pack_capacity_bytes(Settings(fusion_threshold_bytes=0)) == 0
    assert pack_capacity_bytes(Settings(fusion_threshold_bytes=1 << 30, chunk_bytes=4096)) == 4096
    assert pack_capacity_bytes(Settings(fusion_threshold_bytes=1000, chunk_bytes=4096)) == 1000
