"""`hvd.elastic` of horovod.tensorflow (TensorFlow 2, eager): `run`, `TensorFlowKerasState`,
`TensorFlowState` and `ObjectState`, kept by restarts under `hvdtrun --host-discovery-script ...`
(see hvdtrain/core/elastic.py for how and what differs from Horovod's in-place resets)."""

import pickle

import numpy as np

from hvdtrain.core import elastic as _elastic
from hvdtrain.core import rank
from hvdtrain.core.elastic import State  # noqa: F401 (Horovod's name)

from .collectives import broadcast_object, broadcast_variables
from .reduction import optimizer_variables


run, ObjectState = _elastic.framework_api(broadcast_object, rank)


class _VariablesState(ObjectState):
    """Variables saved as NumPy copies, restored by assignment, synced by broadcast."""

    def _variables(self):
        raise NotImplementedError

    def _save_variables(self):
        self._saved_values = [variable.numpy() for variable in self._variables()]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for variable, value in zip(self._variables(), self._saved_values):
            variable.assign(value)
        super().restore()

    def sync(self):
        broadcast_variables(self._variables(), root_rank=0)
        self._save_variables()
        super().sync()

    def saved_bytes(self):
        return pickle.dumps({"values": self._saved_values, "objects": self._saved_state})

    def load_saved_bytes(self, data):
        saved = pickle.loads(data)
        self._saved_values, self._saved_state = [np.asarray(v) for v in saved["values"]], saved["objects"]
        self.restore()


class TensorFlowKerasState(_VariablesState):
    """A built Keras model and its optimizer (given, or the model's compiled one), and any other
    attributes. `backend` is accepted for Horovod's signature: TensorFlow 2 needs no session."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model, self.optimizer, self.backend = model, optimizer or model.optimizer, backend
        self._save_variables()
        super().__init__(**kwargs)

    def _variables(self):
        # Keras 3 makes an optimizer's slots when it is built: a restarted job's ranks build it
        # before they take the committed values, so that every list has the same variables.
        if self.optimizer is not None and not getattr(self.optimizer, "built", True):
            self.optimizer.build(self.model.trainable_variables)
        optimizer = [] if self.optimizer is None else optimizer_variables(self.optimizer)
        return list(self.model.variables) + optimizer


class TensorFlowState(_VariablesState):
    """A list of variables (TensorFlow 2 keeps no global collection: give them) and any other
    attributes. `session` is TensorFlow 1's and refused."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None or session is not None:
            raise ValueError("TensorFlowState needs its variables in TensorFlow 2, which keeps no global "
                             "variables and runs no sessions: TensorFlowState(variables=[...])")
        self.variables = list(variables)
        self._save_variables()
        super().__init__(**kwargs)

    def _variables(self):
        return self.variables


__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState"]
