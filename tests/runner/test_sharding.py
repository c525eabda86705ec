import numpy as np
import pytest

from hvdtrain.training import sharding


@pytest.mark.parametrize("num_samples,size", [(100, 1), (100, 2), (101, 3), (1437, 4), (5, 7)])
def test_training_shards_are_disjoint_equal_and_cover_the_epoch(num_samples, size):
    for epoch in range(3):
        shards = [sharding.train_shard(num_samples, 7, epoch, rank, size) for rank in range(size)]
        taken = np.concatenate(shards)
        assert len(set(taken.tolist())) == len(taken), "a sample went to two ranks"
        assert {len(s) for s in shards} == {num_samples // size}
        left_out = set(range(num_samples)) - set(taken.tolist())
        assert len(left_out) == num_samples % size
        assert set(taken.tolist()) | left_out == set(range(num_samples))


def test_one_shuffle_per_epoch_shared_by_all_ranks_and_repeatable():
    order = sharding.epoch_order(50, 3, 1)
    interleaved = np.stack([sharding.train_shard(50, 3, 1, r, 2) for r in range(2)], axis=1).reshape(-1)
    assert interleaved.tolist() == order.tolist()  # step k of all ranks = the k-th global batch of the shuffle
    assert sharding.epoch_order(50, 3, 1).tolist() == order.tolist()
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


def test_seeds_depend_on_position_only():
    assert sharding.sample_seed(0, 1, 5) == sharding.sample_seed(0, 1, 5)
    assert len({sharding.sample_seed(0, e, i) for e in range(3) for i in range(100)}) == 300
    assert sharding.step_seed(0, 0, 9) != sharding.step_seed(0, 1, 9)
