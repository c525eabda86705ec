"""Horovod's horovod.torch.elastic.sampler: `ElasticSampler`."""

import math

import torch

from hvdtrain.core import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """This rank's share of a dataset's samples for an epoch, as DistributedSampler gives it, less
    those the job has recorded as processed in the epoch: a job started again on another number of
    ranks shares what remains of the epoch among them. The order is drawn from `seed` and the epoch
    (the same on every rank); where the remaining samples do not divide evenly, the first ones are
    given again to fill the last ranks' shares.

    As in Horovod: keep it in a TorchState, call `record_batch` after each batch (every rank
    processed `batch_size` samples) and `set_epoch` with the next epoch at the end of each, which
    clears the record. The dataset's size must not change."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch, self.processed_num = epoch, 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """`batch_size` more samples processed on every rank (`batch_idx`: Horovod's argument, unused)."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch, self.processed_num = state_dict["epoch"], state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Share what remains of the epoch among the ranks there are now."""
        self.num_replicas, self.rank = size(), rank()
        if self.shuffle:
            order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
            order = order.tolist()
        else:
            order = list(range(len(self.dataset)))
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices
        if indices:
            indices = (indices * math.ceil(self.total_size / len(indices)))[:self.total_size]
        return iter(indices[self.rank::self.num_replicas])

    def __len__(self):
        return self.num_samples
