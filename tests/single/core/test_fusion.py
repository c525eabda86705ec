"""The planners of fusion.py. The optimizer's segments and the engine's fused batches, exactly,
at their edges. The transport plan of a batch, checked on many random batches: every element is
reduced exactly once, pieces fit the chunk, packs fit the fusion buffer, and with fusion off
nothing is packed."""

import random

from hvdtrain.core.fusion import Pack, Piece, pack_capacity_bytes, plan_allreduce, plan_batches, plan_segments
from hvdtrain.core.settings import Settings


# ----------------------------------------------------------------------------- plan_segments


def test_segments_close_once_they_hold_segment_bytes_and_keep_to_one_bucket():
    # Backward order of float32 parameters of 10, 300, 20, 500, 40, 60 elements with one of 7
    # float64 elements between the 20 and the 500 (the model of the optimizer's segments test in
    # tests/single/torch/test_optimizer.py).
    gradients = [("f32", 240), ("f32", 160), ("f32", 2000), ("f64", 56), ("f32", 80), ("f32", 1200), ("f32", 40)]
    assert plan_segments(gradients, 1000) == [[0, 1, 2], [3], [4, 5], [6]]
    assert plan_segments(gradients, 1 << 20) == [[0, 1, 2], [3], [4, 5, 6]]


def test_segment_bytes_0_puts_each_gradient_on_its_own():
    assert plan_segments([("a", 4), ("a", 4), ("a", 0)], 0) == [[0], [1], [2]]


def test_a_gradient_larger_than_segment_bytes_closes_its_segment():
    assert plan_segments([("a", 5000), ("a", 10), ("a", 10)], 1000) == [[0], [1, 2]]
    assert plan_segments([("a", 10), ("a", 5000), ("a", 10)], 1000) == [[0, 1], [2]]


def test_a_gradient_outside_the_buckets_is_a_segment_of_its_own():
    assert plan_segments([("a", 1), ("a", 1), (None, 8), ("a", 1), (None, 8), (None, 8)], 1 << 20) == [
        [0, 1], [2], [3], [4], [5]]


def test_a_bucket_coming_back_starts_a_new_segment():
    assert plan_segments([("a", 1), ("b", 1), ("a", 1), ("a", 1)], 1 << 20) == [[0], [1], [2, 3]]


def test_no_gradients_no_segments():
    assert plan_segments([], 1000) == []


# ----------------------------------------------------------------------------- plan_batches


def test_a_batch_takes_allreduces_until_the_next_would_pass_the_threshold():
    assert plan_batches([("k", 3), ("k", 3), ("k", 3), ("k", 5)], 6) == [[0, 1], [2], [3]]
    assert plan_batches([("k", 3), ("k", 3)], 1 << 26) == [[0, 1]]


def test_threshold_0_runs_each_allreduce_alone_each_key_in_turn():
    assert plan_batches([("k", 3), ("k", 3), ("k", 3)], 0) == [[0], [1], [2]]
    # A full batch runs when the next of its key comes; the last of each key at the end.
    assert plan_batches([("a", 3), ("b", 3), ("a", 3)], 0) == [[0], [2], [1]]


def test_an_allreduce_larger_than_the_threshold_goes_alone():
    assert plan_batches([("k", 10), ("k", 1), ("k", 1)], 6) == [[0], [1, 2]]
    assert plan_batches([("k", 1), ("k", 10), ("k", 1)], 6) == [[0], [1], [2]]


def test_interleaved_keys_fill_batches_of_their_own():
    # The full batch of "a" runs when position 2 does not fit; the open ones last, "a" first,
    # as it came first.
    assert plan_batches([("a", 4), ("b", 4), ("a", 4), ("b", 1), ("a", 1)], 6) == [[0], [2, 4], [1, 3]]
    assert plan_batches([("a", 4), ("b", 4), ("b", 4), ("a", 1)], 6) == [[1], [0, 3], [2]]


def test_what_is_not_fused_runs_alone_in_its_place():
    # Key None (another collective, an error) runs where it comes, before the batch of "a" that
    # the allreduce after it fills up.
    assert plan_batches([("a", 4), (None, 0), ("a", 4), ("a", 1), (None, 0)], 6) == [[1], [0], [4], [2, 3]]


def test_no_allreduces_no_batches():
    assert plan_batches([], 6) == []


def test_batches_hold_every_position_once_each_of_one_key_within_the_threshold():
    rng = random.Random(1)
    for _ in range(300):
        ready = [(rng.choice((None, "a", "b", "c")), rng.choice((0, 1, 100, 5000))) for _ in range(rng.randrange(30))]
        threshold = rng.choice((0, 1, 100, 4096, 1 << 26))
        batches = plan_batches(ready, threshold)
        assert sorted(i for batch in batches for i in batch) == list(range(len(ready))), (ready, threshold)
        for batch in batches:
            keys = {ready[i][0] for i in batch}
            assert len(keys) == 1, (ready, threshold, batch)
            if len(batch) > 1:
                assert None not in keys and threshold > 0, (ready, threshold, batch)
                assert sum(ready[i][1] for i in batch) <= threshold, (ready, threshold, batch)
            assert batch == sorted(batch), (ready, threshold, batch)


# ----------------------------------------------------------------------------- plan_allreduce


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
