"""Horovod's Keras callbacks, for Keras 3 and tf-keras alike (whichever Keras tf.keras is)."""

import warnings

import numpy as np
import tensorflow as tf

from hvdtrain import core
from hvdtrain.tensorflow.collectives import broadcast_variables
from hvdtrain.tensorflow.reduction import optimizer_variables, variable_key


def model_and_optimizer_variables(model):
    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None:
        variables += optimizer_variables(model.optimizer)
    return variables


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Make every rank start from root_rank's model and optimizer state.

    Broadcasts when training begins (Keras 3 has built the model and optimizer by then, so
    the first step already starts alike) and again after the first batch, Horovod's moment,
    when optimizers that make their slots lazily (tf-keras) have made them. The model's
    `local_variables` (and those given to register_local_var) keep each rank's values."""

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_refs = set()
        variable_types = (tf.Variable, getattr(tf.keras, "Variable", tf.Variable))  # Keras 3's are no tf.Variable
        if isinstance(local_variables, variable_types):
            local_variables = [local_variables]
        if not all(isinstance(v, variable_types) for v in local_variables or ()):
            raise ValueError("All local variables must be of tf.Variable type.")
        for variable in local_variables or ():
            self.register_local_var(variable)

    def register_local_var(self, var):
        """Leave `var` out of the broadcast: each rank keeps its own value."""
        self._local_refs.add(variable_key(var))

    def on_train_begin(self, logs=None):
        self._broadcast()

    def on_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()
            self.broadcast_done = True

    def _broadcast(self):
        variables = [v for v in model_and_optimizer_variables(self.model) if variable_key(v) not in self._local_refs]
        with tf.device(self.device):
            broadcast_variables(variables, self.root_rank)


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """Replace each epoch's logged metrics with their mean over ranks, for the callbacks after
    this one (ReduceLROnPlateau, TensorBoard, History ...). `device` is accepted for
    Horovod's signature."""

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        names = sorted(logs)
        every_rank = core.allgather_object({name: float(logs[name]) for name in names}, name="MetricAverageCallback")
        for other_rank, metrics in enumerate(every_rank):
            if sorted(metrics) != names:
                raise ValueError(f"MetricAverageCallback: rank {other_rank} logged metrics {sorted(metrics)} but rank "
                                 f"{core.rank()} logged {names}; every rank must log the same metrics")
        for name in names:
            logs[name] = float(np.mean([metrics[name] for metrics in every_rank]))


class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """Set the learning rate to `initial_lr * multiplier(epoch)` from `start_epoch` up to
    (not including) `end_epoch`. A constant multiplier m means `m ** (epoch - start_epoch)`.
    With staircase the rate changes at each epoch's first batch (integer epochs); without,
    at every batch, with the epoch counted fractionally (epoch + batch / steps_per_epoch).

    momentum_correction scales the momentum by new_lr / old_lr for the batch after a change
    (Goyal et al. 2017). It needs the momentum in a variable that the compiled train step
    reads, as tf-keras's legacy optimizers keep it; Keras 3 and tf-keras's newer optimizers
    compile the momentum in as a constant, so for them it is skipped with a warning."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        self.current_epoch = None
        self.restore_momentum = None
        self._momentum = None

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        try:
            optimizer.learning_rate = _learning_rate(optimizer)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{type(self).__name__} sets the optimizer's learning rate, which this optimizer does "
                             f"not allow (is it a LearningRateSchedule?): {error}") from error
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()
        self._momentum = self._momentum_to_correct(optimizer)

    def _momentum_to_correct(self, optimizer):
        momentum = getattr(optimizer, "momentum", None)
        if not self.momentum_correction or momentum is None:
            return None
        if isinstance(momentum, tf.Variable):
            return momentum
        if momentum:
            warnings.warn(f"{type(self).__name__}: {type(optimizer).__name__} compiles its momentum in as a "
                          "constant, so momentum correction is skipped", stacklevel=2)
        return None

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError(f"Could not autodetect the number of steps per epoch. Please specify the steps_per_epoch "
                         f"parameter to the {type(self).__name__}().")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        past_end = self.end_epoch is not None and self.current_epoch >= self.end_epoch
        if self.current_epoch < self.start_epoch or past_end:
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = _learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if self._momentum is not None:
            self.restore_momentum = float(self._momentum.numpy())
            self._momentum.assign(self.restore_momentum * new_lr / old_lr)

    def on_batch_end(self, batch, logs=None):
        if self.restore_momentum:
            self._momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup (Goyal et al. 2017) from `initial_lr / size` to `initial_lr` over
    `warmup_epochs`, changed at every batch:

        lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)

    with the epoch counted fractionally and advanced by one batch, so that each epoch's
    last batch gets a round value."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / core.size() * (epoch * (core.size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and core.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_learning_rate(self.model.optimizer):g}.")


class BestModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """Keep the best model by `monitor` at `filepath`, written by rank 0 only. Horovod's Spark
    estimator filled in the file path; hvdtrain has no Spark estimator, so pass it."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch",
                 filepath=None):
        if filepath is None:
            raise ValueError("BestModelCheckpoint needs filepath=: Horovod's Spark estimator set it, hvdtrain has none")
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def _save_model(self, *args, **kwargs):
        if core.rank() == 0:
            super()._save_model(*args, **kwargs)


def _learning_rate(optimizer):
    return float(np.asarray(optimizer.learning_rate))
