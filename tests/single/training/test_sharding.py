"""Which samples each rank trains on and evaluates (hvdtrain/training/sharding.py): an epoch's
shares are disjoint, equal and together the whole epoch but its remainder; one shuffle per epoch,
the same on every rank; a resume mid-epoch takes the steps that were left; validation takes every
sample once; seeds follow the position alone."""

import numpy as np
import pytest

from hvdtrain.training import sharding

SPLITS = [(100, 1), (100, 2), (101, 3), (1437, 4), (5, 7)]


def shards_of_three_epochs(num_samples, size):
    return [[sharding.train_shard(num_samples, 7, epoch, rank, size) for rank in range(size)] for epoch in range(3)]


@pytest.mark.parametrize("num_samples,size", SPLITS)
def test_no_sample_goes_to_two_ranks(num_samples, size):
    for shards in shards_of_three_epochs(num_samples, size):
        taken = np.concatenate(shards)
        assert len(set(taken.tolist())) == len(taken), "a sample went to two ranks"


@pytest.mark.parametrize("num_samples,size", SPLITS)
def test_every_rank_gets_an_equal_share(num_samples, size):
    for shards in shards_of_three_epochs(num_samples, size):
        assert {len(s) for s in shards} == {num_samples // size}


@pytest.mark.parametrize("num_samples,size", SPLITS)
def test_the_shares_cover_the_epoch_but_its_remainder(num_samples, size):
    for shards in shards_of_three_epochs(num_samples, size):
        taken = np.concatenate(shards)
        left_out = set(range(num_samples)) - set(taken.tolist())
        assert len(left_out) == num_samples % size
        assert set(taken.tolist()) | left_out == set(range(num_samples))


def test_step_k_of_all_ranks_is_the_kth_global_batch_of_the_epochs_shuffle():
    order = sharding.epoch_order(50, 3, 1)
    interleaved = np.stack([sharding.train_shard(50, 3, 1, r, 2) for r in range(2)], axis=1).reshape(-1)
    assert interleaved.tolist() == order.tolist()


def test_the_shuffle_repeats_for_the_same_seed_and_epoch():
    assert sharding.epoch_order(50, 3, 1).tolist() == sharding.epoch_order(50, 3, 1).tolist()


def test_another_epoch_or_seed_shuffles_otherwise():
    order = sharding.epoch_order(50, 3, 1)
    assert sharding.epoch_order(50, 3, 2).tolist() != order.tolist()
    assert sharding.epoch_order(50, 4, 1).tolist() != order.tolist()


def test_mid_epoch_position_gives_the_remaining_steps():
    shard = sharding.train_shard(1000, 0, 0, 1, 3)
    steps = [sharding.step_samples(shard, k, 8) for k in range(len(shard) // 8)]
    resumed = shard[5 * 8:len(steps) * 8]
    assert np.concatenate(steps[5:]).tolist() == resumed.tolist()


@pytest.mark.parametrize("num_samples,size", [(360, 2), (10, 3), (2, 4)])
def test_validation_shards_partition_the_set(num_samples, size):
    shards = [sharding.eval_shard(num_samples, r, size).tolist() for r in range(size)]
    assert sorted(sum(shards, [])) == list(range(num_samples))


def test_a_samples_seed_depends_on_its_position_only():
    assert sharding.sample_seed(0, 1, 5) == sharding.sample_seed(0, 1, 5)
    assert len({sharding.sample_seed(0, e, i) for e in range(3) for i in range(100)}) == 300


def test_a_steps_seed_differs_from_rank_to_rank():
    assert sharding.step_seed(0, 0, 9) != sharding.step_seed(0, 1, 9)
