"""`hvd.elastic` of horovod.tensorflow.keras: `run`, `KerasState` and the callbacks that keep a
`model.fit` loop's place in the state (see hvdtrain/core/elastic.py for how hvdtrain keeps a
Horovod Elastic script going by restarts)."""

import tensorflow as tf

from hvdtrain.tensorflow.elastic import ObjectState, TensorFlowKerasState, run  # noqa: F401 (Horovod's names)


class KerasState(TensorFlowKerasState):
    """A `tf.keras` model, its optimizer and any other attributes."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches, and at the end of every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state, self.batches_per_commit = state, batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keep `state.batch` at the batch just done (0 after each epoch); with `steps_per_epoch`,
    the first epoch after a restart is shortened by the batches done before it."""

    def __init__(self, state):
        super().__init__()
        self.state, self.steps_per_epoch = state, None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keep `state.epoch` at the number of epochs done: those before this `fit` began and this
    fit's (which, as in Horovod's examples, is given `epochs=total - state.epoch`)."""

    def __init__(self, state):
        super().__init__()
        self.state, self.initial_epoch = state, state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["run", "KerasState", "ObjectState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback"]
