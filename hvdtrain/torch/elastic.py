"""`hvd.elastic` of horovod.torch: `run`, `TorchState`, `ObjectState` and `ElasticSampler`, kept by
restarts under `hvdtrun --host-discovery-script ...` (see hvdtrain/core/elastic.py for how and what
differs)."""

import copy
import io
import math

import torch

from hvdtrain.core import elastic as _elastic
from hvdtrain.core import rank, size
from hvdtrain.core.elastic import State  # noqa: F401 (Horovod's name)

from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


run, ObjectState = _elastic.framework_api(broadcast_object, rank)


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


def _sync_sampler(sampler):
    sampler.load_state_dict(broadcast_object(sampler.state_dict()))


# The objects a TorchState keeps by their state dicts, restoring them in place (the script holds
# them too), and how each kind is synced from rank 0.
_SYNCED_BY_KIND = ((torch.nn.Module, lambda model: broadcast_parameters(model.state_dict(), root_rank=0)),
                   (torch.optim.Optimizer, lambda optimizer: broadcast_optimizer_state(optimizer, root_rank=0)),
                   (ElasticSampler, _sync_sampler))


def _sync_function(value):
    return next((sync for kind, sync in _SYNCED_BY_KIND if isinstance(value, kind)), None)


class TorchState(ObjectState):
    """Models, optimizers and ElasticSamplers, under any names (`model` and `optimizer` also by
    position), kept by their state dicts and restored in place; any other attributes as plain
    objects."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        attributes = {"model": model, "optimizer": optimizer, **kwargs}
        self._kept = {name: value for name, value in attributes.items() if _sync_function(value)}
        self._saved_dicts = {}
        super().__init__(**{name: value for name, value in attributes.items() if name not in self._kept})
        for name, value in self._kept.items():
            object.__setattr__(self, name, value)
        self._save_dicts()

    def _save_dicts(self):
        self._saved_dicts = {name: copy.deepcopy(value.state_dict()) for name, value in self._kept.items()}

    def save(self):
        self._save_dicts()
        super().save()

    def restore(self):
        for name, value in self._kept.items():
            value.load_state_dict(self._saved_dicts[name])
        super().restore()

    def sync(self):
        for value in self._kept.values():
            _sync_function(value)(value)
        super().sync()

    def saved_bytes(self):
        buffer = io.BytesIO()
        torch.save({"dicts": self._saved_dicts, "objects": self._saved_state}, buffer)
        return buffer.getvalue()

    def load_saved_bytes(self, data):
        # The store holds what this job's own rank 0 committed: not a file from elsewhere.
        saved = torch.load(io.BytesIO(data), weights_only=False)
        self._saved_dicts, self._saved_state = saved["dicts"], saved["objects"]
        self.restore()

    def __setattr__(self, name, value):
        if name in getattr(self, "_kept", {}):  # state.model = other_model: keep the new one, as it is now
            self._kept[name] = value
            self._saved_dicts[name] = copy.deepcopy(value.state_dict())
        super().__setattr__(name, value)


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]
