"""Which samples each rank trains on and evaluates, and the seeds that make a run repeatable.

Training: one shuffle per epoch, seeded by (seed, epoch) and the same on every rank; rank r takes
every N-th sample of it starting at r. So the ranks' shares are disjoint, all of equal length
(the allreduce averages equal batches), and together they are the whole epoch except the
`n mod N` samples at the end of the shuffle -- a different few each epoch. Step k of an epoch
takes the k-th slice of every share, so a run resumes mid-epoch from (epoch, step) alone.

Every random draw is derived from a position -- (seed, epoch, sample) for data augmentation,
(seed, rank, step) for the model's own randomness -- so a resumed run repeats exactly what the
interrupted one would have done, with no generator state to carry over.
"""

import numpy as np


def epoch_order(num_samples, seed, epoch):
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def train_shard(num_samples, seed, epoch, rank, size):
    """The sample indices rank `rank` of `size` trains on in `epoch`, in order."""
    order = epoch_order(num_samples, seed, epoch)
    return order[rank:size * (num_samples // size):size]


def step_samples(shard, step, samples_per_step):
    """The samples of one optimizer step of a rank (all its backward passes)."""
    return shard[step * samples_per_step:(step + 1) * samples_per_step]


def eval_shard(num_samples, rank, size):
    """Validation: every sample exactly once, rank r taking r, r + N, r + 2N, ..."""
    return np.arange(rank, num_samples, size)


def sample_seed(seed, epoch, index):
    """The seed of one sample's random augmentation in one epoch."""
    return int(np.random.SeedSequence([seed, epoch, int(index)]).generate_state(1)[0])


def step_seed(seed, rank, global_step):
    """The seed of a rank's model randomness (dropout) in one optimizer step."""
    return int(np.random.SeedSequence([seed, rank, global_step, 1]).generate_state(1)[0])
