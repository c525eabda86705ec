"""`hvd.elastic` of horovod.torch: `run`, `TorchState` and `ObjectState`, kept by restarts under
`hvdtrun --host-discovery-script ...` (see hvdtrain/core/elastic.py for how and what differs)."""

import copy
import io

import torch

from hvdtrain.core import elastic as _elastic
from hvdtrain.core import rank
from hvdtrain.core.elastic import State  # noqa: F401 (Horovod's name)

from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


run, ObjectState = _elastic.framework_api(broadcast_object, rank)


class TorchState(ObjectState):
    """A model, an optimizer (either may be None) and any other attributes; the model's and the
    optimizer's state dicts are saved, restored and synced, the rest as plain objects."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self._modules = {name: value for name, value in (("model", model), ("optimizer", optimizer))
                         if value is not None}
        self._saved_dicts = {}
        super().__init__(**kwargs)
        for name, value in self._modules.items():
            object.__setattr__(self, name, value)
        self._save_dicts()

    def _save_dicts(self):
        self._saved_dicts = {name: copy.deepcopy(value.state_dict()) for name, value in self._modules.items()}

    def save(self):
        self._save_dicts()
        super().save()

    def restore(self):
        for name, value in self._modules.items():
            value.load_state_dict(self._saved_dicts[name])
        super().restore()

    def sync(self):
        if "model" in self._modules:
            broadcast_parameters(self._modules["model"].state_dict(), root_rank=0)
        if "optimizer" in self._modules:
            broadcast_optimizer_state(self._modules["optimizer"], root_rank=0)
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
        if name in getattr(self, "_modules", {}):  # state.model = other_model: track the new one
            self._modules[name] = value
        super().__setattr__(name, value)


__all__ = ["run", "State", "ObjectState", "TorchState"]
