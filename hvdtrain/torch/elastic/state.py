"""Horovod's horovod.torch.elastic.state: `TorchState` and `ObjectState`, with the `run` made on the
same broadcast (see hvdtrain/core/elastic.py for how restarts keep them, and what differs)."""

import copy
import io

import torch

from hvdtrain.core import elastic as _elastic
from hvdtrain.core import rank
from hvdtrain.core.elastic import State  # noqa: F401 (Horovod's name)

from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


run, ObjectState = _elastic.framework_api(broadcast_object, rank)


def _sync_by_state_dict(value):
    value.load_state_dict(broadcast_object(value.state_dict()))


# Models and optimizers sync from rank 0 by their tensors' broadcasts; other objects kept by their
# state dicts, by one broadcast of the dict.
_SYNCED_BY_KIND = ((torch.nn.Module, lambda model: broadcast_parameters(model.state_dict(), root_rank=0)),
                   (torch.optim.Optimizer, lambda optimizer: broadcast_optimizer_state(optimizer, root_rank=0)))


def _sync_function(value):
    """How a TorchState syncs `value` if it keeps it by its state dict (anything with state_dict()
    and load_state_dict(): models, optimizers, ElasticSamplers, LR schedulers, GradScalers), else
    None. Such objects are restored in place, as the script holds them too: an LR scheduler kept as
    a plain object would come back as a copy whose optimizer is a copy too, and could not be
    saved for a restart (it refers to the DistributedOptimizer, whose class does not pickle)."""
    if isinstance(value, type) or not (callable(getattr(value, "state_dict", None))
                                       and callable(getattr(value, "load_state_dict", None))):
        return None
    return next((sync for kind, sync in _SYNCED_BY_KIND if isinstance(value, kind)), _sync_by_state_dict)


def _torch_bytes(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


class TorchState(ObjectState):
    """Models, optimizers, ElasticSamplers, LR schedulers and any other objects with a state dict,
    under any names (`model` and `optimizer` also by position), kept by their state dicts and
    restored in place; any other attributes as plain objects."""

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
        return _elastic.state_bytes(_torch_bytes, {"dicts": self._saved_dicts, "objects": self._saved_state},
                                    {**self._saved_dicts, **self._saved_state})

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
